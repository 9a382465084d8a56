"""The report's model runs inside the training process (``Run.finish()`` writes metrics_report.json),
so it and everything it imports are the standard library, the schema and themselves."""

from __future__ import annotations

import json
import sys

from test_import_rules import MODULES, gpulse_imports, third_party

#: what runs inside training; model imports diagnose, records, phases (a step's parts) and host
#: (the host summary, None there), diagnose units
IN_TRAINING = (
    "gpulse.report.model",
    "gpulse.report.phases",
    "gpulse.report.diagnose",
    "gpulse.report.records",
    "gpulse.report.units",
    "gpulse.report.host",
)


def test_the_report_model_imports_only_the_standard_library_the_schema_and_itself() -> None:
    broken = []
    for name in IN_TRAINING:
        path = MODULES[name]
        broken += [
            f"{name} imports {m}"
            for m in sorted(gpulse_imports(path))
            if m not in (*IN_TRAINING, "gpulse.schema", "gpulse.report")
        ]
        broken += [f"{name} imports third-party {m}" for m in sorted(third_party(path))]
    assert not broken, "\n".join(broken)


def test_importing_the_model_loads_no_other_gpulse_module() -> None:
    import subprocess

    code = (
        "import json, sys, gpulse.report.model; print(json.dumps([m for m in sys.modules if m.startswith('gpulse')]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    loaded = set(json.loads(out.stdout))
    assert loaded <= {"gpulse", "gpulse.report", *IN_TRAINING, "gpulse.schema"}, loaded
