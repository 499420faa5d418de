"""``python -m app.config "key=value ..."``: the command line of :mod:`app.config.cli`."""

from app.config.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
