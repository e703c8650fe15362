"""``python -m modulelens ...``: the same as the ``modulelens`` command."""

from modulelens.cli.app import get_app

if __name__ == "__main__":
    get_app()(prog_name="modulelens")
