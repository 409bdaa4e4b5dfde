"""The ``--feature-gates NAME=BOOL,...`` option of the emulator's and the control plane's commands."""


def parse_feature_gates(text: str) -> dict[str, bool]:
    gates: dict[str, bool] = {}
    for item in filter(None, (part.strip() for part in text.split(','))):
        name, sep, value = item.partition('=')
        if not sep or value.lower() not in ('true', 'false'):
            raise SystemExit(f'Error: a feature gate must be NAME=true or NAME=false, not {item!r}.')
        gates[name] = value.lower() == 'true'
    return gates
