"""Calibration and fitting, apart from the engine: the simulator's profiles fitted to measured kernel
tables (kernel_data, fitting, profile_specs, calibrate), re-fitted to requests recorded on a real
engine (replay, record_fit, table_fit) or to whole GPU iterations (step_fit), an engine's own log
read for its step timing (calibrate_engine_log), and small served experiments (experiment).

The engine (sim/) never imports this package; `python -m llmserve_env.tools.calibrate` (also
`llmserve-env calibrate`) is its command line.
"""
