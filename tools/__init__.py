"""Run tooling, apart from the library: training (train.py with train_config.py, train_rllib.py,
tune_ppo.py), evaluation (evaluate.py), the command-line helpers every command shares (cli.py) and
starting a server as a process (launch.py). The library packages (shared/, core/, sim/, gateway/,
server/, agents/) never import this package; `llmserve-env COMMAND` (__main__.py) dispatches here.

    python tools/train.py --task static_workload      # = llmserve-env train ...
    python tools/evaluate.py --agent heuristic         # = llmserve-env evaluate ...
"""
