"""Run tooling, apart from the library: the command lines and what only they use. The library
packages (shared/, core/, sim/, gateway/, agents/) never import this package and define no `main`;
`llmserve-env COMMAND` (__main__.py) dispatches here.

    train.py, train_config.py   PPO on one task (python tools/train.py; llmserve-env train)
    train_rllib.py, tune_ppo.py RLlib's PPO, and a Ray Tune sweep of train.py (the rllib extra)
    evaluate.py                 policies scored on held-out seeds (llmserve-env evaluate)
    tune_static.py, tune_heuristic.py, tune_autoscale.py, tune_operator.py
                                the rivals' settings searched on training seeds and stored
    grade.py                    a task's references; an episode log graded, or replayed and graded
    calibrate.py                simulator profiles fitted (llmserve-env calibrate; sim/calibration/)
    standin.py                  the OpenAI-compatible stand-in server (sim/standin/); standin_harness.py
                                runs it in a thread for tests
    cli.py                      the argument types, help format, logging and progress every command shares
    launch.py                   starting a server as a process (or a thread) and waiting for it
"""
