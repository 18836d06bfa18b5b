"""A pipeline schedule for the measured profile: 1F1B with one more warm-up forward than
PipeDream-Flush (to overlap a stage's send with its next forward), so stage i of p holds
min(p - i + 1, m) micro-batches at its peak. Select it with pipeline_schedule="myorg.eager-1f1b"."""

from mlsysim_core import hookimpl
from mlsysim_plugins.measured.schedules import PipelineSchedule


def in_flight(p, stage, m, v):
    """Micro-batches (in units of the stage's layer stack) stage `stage` (0-based) of `p`
    holds at its peak, with `m` micro-batches per iteration and `v` model chunks per rank."""
    return min(p - stage + 1, m)


EAGER_1F1B = PipelineSchedule(name="myorg.eager-1f1b", in_flight=in_flight,
                              description="1F1B with one extra warm-up forward per stage")


@hookimpl
def mlsysim_measured_pipeline_schedules():
    return [EAGER_1F1B]
