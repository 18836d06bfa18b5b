"""Published throughput on accelerators without a fitted calibration (issue 27 item 4): B200 and GB200 rows,
held out, reported per accelerator by calibrate.py as uncalibrated. Run by published.py (its last line), which
passes its own names (``_row``, ``_MB``, ...) as this module's globals: the rows are recorded as published.py's
rows are, with its helpers, not copies of them.
"""

CASES_MORE: list = []
