"""`python -m onceflow`: the `onceflow` command, for where its script is not on PATH."""

from onceflow.cli import main

if __name__ == "__main__":
    main()
