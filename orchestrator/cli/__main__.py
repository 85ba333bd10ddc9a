"""`python -m orchestrator.cli`: the `chorus` command."""

from orchestrator.cli import main

if __name__ == "__main__":
    main()
