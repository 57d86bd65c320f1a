from llmserve_env.sim.standin.cli import main

main()
