"""``python -m jaxconv``: the command line (see ``jaxconv --help``)."""

from jaxconv._src.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
