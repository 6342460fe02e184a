"""Lever trials (`cost-router levers trial|plan`, docs/levers.md): logged prompts replayed against
a reference tier and candidate tiers (a quantized build, a distilled model, the same model with
speculative decoding), measured per request, judged per pair, summarised per lever alone and in
combination, gated, and written as `levers.json` for `cost-router what-if --levers`.

`prompts.py` (the prompts and their gold answers), `records.py` (a tier, a measurement),
`measure.py` (one streamed request), `store.py` (the incremental result files a rerun resumes
from), `trial.py` (the run), `summary.py` (rows, intervals, combinations), `gate.py` (the release
verdict), `plan.py` (the plan file), `levers_file.py` (`levers.json` and what what-if takes).
"""
