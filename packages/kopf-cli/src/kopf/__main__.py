"""``python -m kopf``: the same as the ``kopf`` command."""
from kopf._cli.commands import main

if __name__ == '__main__':
    main(prog_name='kopf')
