"""The ``kopf`` command and its sub-commands."""
import importlib.metadata

import click

DISTRIBUTIONS = ('kopf', 'kopf-clients', 'kopf-core', 'kopf-webhooks', 'kopf-cli', 'kopf-testing')


def _versions() -> str:
    lines = []
    for dist in DISTRIBUTIONS:
        try:
            lines.append(f'{dist} {importlib.metadata.version(dist)}')
        except importlib.metadata.PackageNotFoundError:
            if dist != 'kopf':  # the meta-package is optional: the parts can be installed alone
                lines.append(f'{dist} (not installed)')
    return '\n'.join(lines)


def _print_version(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(_versions())
        ctx.exit()


@click.group(name='kopf', context_settings={'help_option_names': ['-h', '--help']})
@click.option('--version', is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help='Show the versions of the installed kopf distributions and exit.')
def main() -> None:
    """Kopf: the Kubernetes Operator Pythonic Framework."""
