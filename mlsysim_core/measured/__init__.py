"""The measured-grade profile's building blocks: regimes, shapes, layer activations,
optimizer states and transients, runtime overheads. Plugins (built-in and third-party)
import these to give their specs a measured-grade model; see docs/profiles.md."""
