"""
The soak's invariants: computed from the driver's truth, the operator's journal, the final state
of the objects, and the operator's logs. Each is printed with its figures; the exit code is 0
only if all of them hold (except the known failures of a profile, which are printed as such).
"""

import collections
import dataclasses
import itertools
import re
from typing import TYPE_CHECKING, Any

from tools.soak import sampling

if TYPE_CHECKING:
    from tools.soak.driver import Soak

FINALIZER = 'kopf.zalando.org/KopfFinalizerMarker'
CHANGE_HANDLERS = ('create_fn', 'update_fn', 'field_fn', 'delete_fn')
SIGKILL_WINDOW = 10.0  # a call this close before a SIGKILL of its process may have lost its outcome's write
CONFLICT_FALLBACK = 'The object has changed meanwhile'  # the operator's debug message after a 409
LOG_LINE = re.compile(r'^\[[^]]+\] (?P<logger>\S+)\s+\[(?P<level>\w+)\s*\] (?P<message>.*)$')
# The reports of what the soak injects: the failures, the throttling, the emulator's restarts.
INJECTED = re.compile(r'emulator injected a failure|throttled by the server|connection refused|'
                      r'Server disconnected|Connection reset', re.IGNORECASE)


@dataclasses.dataclass
class Result:
    name: str
    holds: bool
    figures: str
    applicable: bool = True  # not on every API server (e.g. no namespace controller on a bare control plane)


def rss_of(pid: int) -> int | None:
    """The resident memory of a process in kB (Linux), or ``None`` if unknown."""
    try:
        with open(f'/proc/{pid}/status') as f:
            for line in f:
                if line.startswith('VmRSS:'):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _ok_calls(soak: 'Soak', handler: str) -> dict[str, list[dict[str, Any]]]:
    calls: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for record in soak.journal.records:
        if record['handler'] == handler and record['outcome'] == 'ok':
            calls[record['object']].append(record)
    return calls


def pending(soak: 'Soak', final_state: list[dict[str, Any]], final_namespaces: list[dict[str, Any]]) -> bool:
    """Whether the operator has something left to do (so the settling goes on)."""
    return bool(_lost(soak, final_state)[1] or _stuck(soak, final_state) or _stale(soak, final_state)
                or _remaining_namespaces(soak, final_namespaces))


def _remaining_namespaces(soak: 'Soak', final_namespaces: list[dict[str, Any]]) -> list[str]:
    """The short-lived namespaces deleted by the churn but still present (e.g. Terminating)."""
    return [ns['metadata']['name'] for ns in final_namespaces
            if ns['metadata']['name'] in soak.world.deleted_namespaces]


def _lost(soak: 'Soak', final_state: list[dict[str, Any]]) -> tuple[str, int]:
    creates, deletes = _ok_calls(soak, 'create_fn'), _ok_calls(soak, 'delete_fn')
    handled_versions: dict[str, set[int]] = collections.defaultdict(set)
    for handler in ('create_fn', 'update_fn', 'field_fn'):
        for name, calls in _ok_calls(soak, handler).items():
            handled_versions[name].update(call['version'] for call in calls)
    # The objects deleted with their namespaces while their creation was being retried never finish it.
    cut_short = _deleted_while_retrying(soak, creates)
    lost_creates = [name for name in soak.world.created
                    if name not in soak.world.stubborn and name not in creates and name not in cut_short]
    lost_deletes = [name for name in soak.world.deleted if name not in deletes]
    lost_updates = [obj['metadata']['name'] for obj in final_state
                    if obj['metadata']['name'] not in soak.world.stubborn
                    and obj['spec']['version'] not in handled_versions[obj['metadata']['name']]]
    total = len(lost_creates) + len(lost_deletes) + len(lost_updates)
    expected_creates = len(soak.world.created) - len(soak.world.stubborn | cut_short)
    figures = (f'{len(lost_creates)} creations of {expected_creates}, '
               f'{len(lost_deletes)} deletions of {len(soak.world.deleted)}, '
               f'{len(lost_updates)} final versions of {len(final_state)} remaining objects '
               f'({soak.world.updates} updates made)')
    examples = (lost_creates + lost_deletes + lost_updates)[:5]
    if examples:
        figures += f'; e.g. {", ".join(examples)}'
    return figures, total


def _deleted_while_retrying(soak: 'Soak', creates: dict[str, list[dict[str, Any]]]) -> set[str]:
    """The objects deleted with their namespaces after their creation was tried, but before it succeeded."""
    return {name for name in soak.world.deleted_with_namespace
            if name in soak.journal.create_attempted and name not in creates}


def _stuck(soak: 'Soak', final_state: list[dict[str, Any]]) -> list[str]:
    """The objects deleted by the churn but still present (held by a finalizer)."""
    return [obj['metadata']['name'] for obj in final_state
            if obj['metadata']['name'] in soak.world.deleted or obj['metadata'].get('deletionTimestamp')]


def _stale(soak: 'Soak', final_state: list[dict[str, Any]]) -> list[str]:
    """The remaining objects whose last handled state (by any change handler) differs from their final one."""
    last: dict[str, dict[str, Any]] = {}
    for record in soak.journal.records:
        if record['outcome'] == 'ok' and record['handler'] in ('create_fn', 'update_fn', 'field_fn'):
            last[record['object']] = record
    return [obj['metadata']['name'] for obj in final_state
            if obj['metadata']['name'] not in soak.world.stubborn
            and ((handled := last.get(obj['metadata']['name'])) is None
                 or handled['version'] != obj['spec']['version']
                 or handled['labels'] != obj['metadata'].get('labels', {}))]


def _unseen_by_some(soak: 'Soak', final_state: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """
    The remaining objects whose final state was not seen by every handler interested in it.

    This happened when the object changed in the middle of a handling cycle of several handlers
    (one handler per cycle step by default): the handlers done before the change were not called
    again, and the diff-base stored at the cycle's end already had the change (as in Kopf 1.45.2:
    nolar/kopf#641). Now they are called again, but what they were called with is kept in memory
    only: if the cycle goes on in the next incarnation of the operator (the next call for the object
    that sees its newer state is made by another process), they are not. Those objects are returned apart.
    (Not the next call of any state: the same process can finish the cycle's steps of the missed call's state,
    with the cycle's end not stored before it is killed; seen on the real server while it restarted.)
    """
    last_change: dict[str, tuple[int, dict[str, Any]]] = {}
    last_field: dict[str, tuple[int, dict[str, Any]]] = {}
    calls: dict[str, list[tuple[int, dict[str, Any]]]] = collections.defaultdict(list)
    for index, record in enumerate(soak.journal.records):
        if record['outcome'] != 'ok':
            continue
        if record['handler'] in ('create_fn', 'update_fn'):
            last_change[record['object']] = (index, record)
        elif record['handler'] == 'field_fn':
            last_field[record['object']] = (index, record)
        else:
            continue
        calls[record['object']].append((index, record))

    def continued_by_another_process(name: str, missed: tuple[int, dict[str, Any]] | None) -> bool:
        if missed is None:
            return False
        index, record = missed
        seen = (record['version'], record['labels'], record['field'])
        newer = [call for position, call in calls[name]
                 if position > index and (call['version'], call['labels'], call['field']) != seen]
        return bool(newer) and newer[0]['pid'] != record['pid']

    unseen, across_restarts = [], []
    for obj in final_state:
        name = obj['metadata']['name']
        if name in soak.world.stubborn:
            continue
        change, field = last_change.get(name), last_field.get(name)
        change_missed = (change is None or change[1]['version'] != obj['spec']['version']
                         or change[1]['labels'] != obj['metadata'].get('labels', {}))
        field_missed = field is None or field[1]['new'] != obj['spec'].get('field')
        if not change_missed and not field_missed:
            continue
        if ((not change_missed or continued_by_another_process(name, change)) and
                (not field_missed or continued_by_another_process(name, field))):
            across_restarts.append(name)
        else:
            unseen.append(name)
    return unseen, across_restarts


def _duplicates(soak: 'Soak') -> tuple[int, int, list[str]]:
    """Successful calls repeated for the same object, handler and version: after a SIGKILL, or not."""
    kills = collections.defaultdict(list)
    for when, pid in soak.world.kills:
        kills[pid].append(when)
    around_kills, unexpected, examples = 0, 0, []
    for handler in CHANGE_HANDLERS:
        for name, calls in _ok_calls(soak, handler).items():
            by_version = collections.defaultdict(list)
            for call in calls:
                by_version[call['version']].append(call)
            for version, repeated in by_version.items():
                for earlier, later in itertools.pairwise(repeated):
                    killed_soon_after = any(0 <= when - earlier['time'] <= SIGKILL_WINDOW
                                            for when in kills.get(earlier['pid'], []))
                    if killed_soon_after and later['pid'] != earlier['pid']:
                        around_kills += 1
                    else:
                        unexpected += 1
                        pids = f'pids {earlier["pid"]}, {later["pid"]}'
                        examples.append(f'{handler} of {name} v{version} ({pids})')
    return around_kills, unexpected, examples


def _after_deletion(soak: 'Soak') -> list[str]:
    """The timers and daemons that ran for an object after its deletion was handled (its end)."""
    deleted_at: dict[str, float] = {}
    for record in soak.journal.records:
        if record['handler'] == 'delete_fn' and record['outcome'] == 'ok':
            deleted_at.setdefault(record['object'], record['time'])
    late = []
    for record in soak.journal.activities:
        name = record['object']
        is_activity = record['handler'] == 'timer_fn' or record['outcome'] == 'started'
        if is_activity and name in deleted_at and record['time'] > deleted_at[name]:
            late.append(f'{record["handler"]} of {name} {record["time"] - deleted_at[name]:.2f} s after')
    return late


@dataclasses.dataclass
class LogFindings:
    tracebacks: int = 0  # the log records with a traceback
    multiline: int = 0  # the log records with extra lines but no traceback
    faults: int = 0  # the one-line reports of the injected faults
    above_warning: int = 0  # ... of them above WARNING
    leaks: int = 0  # the token's occurrences
    trace_examples: list[str] = dataclasses.field(default_factory=list)
    fault_examples: list[str] = dataclasses.field(default_factory=list)


def _log_problems(soak: 'Soak') -> LogFindings:
    """
    What the logs show: tracebacks, multi-line records, the reports of the injected faults (and how
    many are above WARNING), and the token's leaks. A record is a log line with the lines that follow
    it outside the log format (e.g. its traceback).
    """
    findings = LogFindings()
    for incarnation in soak.incarnations:
        text = incarnation.log_path.read_text(errors='replace')
        findings.leaks += text.count(soak.token)
        records: list[tuple[int, list[str]]] = []  # (the first line's number, the lines)
        for index, line in enumerate(text.splitlines()):
            if LOG_LINE.match(line) or not records:
                records.append((index + 1, [line]))
            else:
                records[-1][1].append(line)
        for number, block in records:
            where = f'operator-{incarnation.number}.log:{number}'
            parsed = LOG_LINE.match(block[0])
            if len(block) > 1 or parsed is None:
                if any(line.startswith('Traceback') for line in block):
                    findings.tracebacks += 1
                    findings.trace_examples.append(f'{where}: {block[0][:200]} ... {block[-1][:200]}')
                else:
                    findings.multiline += 1
                    findings.trace_examples.append(f'{where}: {block[0][:200]} ... {block[-1][:200]}')
            if parsed is not None and INJECTED.search(parsed['message']):
                findings.faults += 1
                if parsed['level'] not in ('WARNING', 'INFO', 'DEBUG'):
                    findings.above_warning += 1
                    findings.fault_examples.append(f'{where}: {block[0][:300]}')
    return findings


def _examples(examples: list[str], separator: str = ', ', limit: int = 3) -> str:
    return f'; e.g. {separator.join(examples[:limit])}' if examples else ''


def _namespace_churn(soak: 'Soak', final_state: list[dict[str, Any]],
                     final_namespaces: list[dict[str, Any]]) -> list[Result]:
    """The objects deleted with their namespaces: each handled and released; each namespace gone."""
    results = []
    deletes = _ok_calls(soak, 'delete_fn')
    remaining = {obj['metadata']['name']: obj for obj in final_state}
    cascaded = sorted(soak.world.deleted_with_namespace)
    unhandled = [name for name in cascaded if name not in deletes]
    held = [name for name in cascaded if name in remaining]
    held_by_us = [name for name in held if FINALIZER in remaining[name]['metadata'].get('finalizers', [])]
    retrying = _deleted_while_retrying(soak, _ok_calls(soak, 'create_fn'))
    all_in_tmp = sum(len(names) for names in soak.world.tmp_namespaces.values())
    figures = (f'{len(unhandled)} without the deletion handler, {len(held)} still present '
               f'({len(held_by_us)} with our finalizer), of {len(cascaded)} objects deleted with '
               f'{len(soak.world.deleted_namespaces)} namespaces ({len(retrying)} of them while their '
               f'creation was being retried; {all_in_tmp - len(cascaded)} deleted before their namespace)')
    results.append(Result('objects in deleted namespaces handled and released', not unhandled and not held,
                          figures + _examples(sorted(set(unhandled) | set(held)), limit=5)))

    left = _remaining_namespaces(soak, final_namespaces)
    by_name = {ns['metadata']['name']: ns for ns in final_namespaces}
    details = [f'{name} ({by_name[name].get("status", {}).get("phase", "?")}, '
               f'{sum(1 for obj in final_state if obj["metadata"].get("namespace") == name)} objects left)'
               for name in left]
    never_deleted = sorted(set(soak.world.tmp_namespaces) - soak.world.deleted_namespaces)
    holds = not left and not never_deleted and len(soak.world.tmp_namespaces) == soak.profile.tmp_namespaces
    results.append(Result('deleted namespaces fully gone', holds,
                          f'{len(left)} of {len(soak.world.deleted_namespaces)} deleted namespaces remain; '
                          f'{len(soak.world.tmp_namespaces)} of {soak.profile.tmp_namespaces} planned were '
                          f'created, {len(never_deleted)} never deleted'
                          + _examples(details + never_deleted, limit=5)))
    return results


def check_all(soak: 'Soak', final_state: list[dict[str, Any]], final_namespaces: list[dict[str, Any]],
              events: list[dict[str, Any]]) -> list[Result]:
    results = []
    lost_figures, lost_total = _lost(soak, final_state)
    results.append(Result('none lost', lost_total == 0, lost_figures))

    around_kills, unexpected, examples = _duplicates(soak)
    figures = f'{unexpected} unexpected; {around_kills} around {len(soak.world.kills)} SIGKILLs (allowed)'
    if examples:
        figures += f'; e.g. {"; ".join(examples[:5])}'
    results.append(Result('duplicates only around SIGKILLs', unexpected == 0, figures))

    stuck = _stuck(soak, final_state)
    with_finalizer = [obj['metadata']['name'] for obj in final_state if obj['metadata']['name'] in stuck
                      and FINALIZER in obj['metadata'].get('finalizers', [])]
    results.append(Result('no finalizer left on deleted objects', not stuck,
                          f'{len(stuck)} of {len(soak.world.deleted)} deleted objects remain '
                          f'({len(with_finalizer)} with our finalizer)'
                          f'{"; e.g. " + ", ".join(stuck[:5]) if stuck else ""}'))

    stale = _stale(soak, final_state)
    results.append(Result('last-handled state equals final spec', not stale,
                          f'{len(stale)} of {len(final_state)} remaining objects differ'
                          f'{"; e.g. " + ", ".join(stale[:5]) if stale else ""}'))

    unseen, across_restarts = _unseen_by_some(soak, final_state)
    results.append(Result('every handler saw the final state', not unseen,
                          f'{len(unseen)} of {len(final_state)} remaining objects changed in the middle of '
                          f'a handling cycle, after some of its handlers had finished'
                          f'{"; e.g. " + ", ".join(unseen[:5]) if unseen else ""}; '
                          f'{len(across_restarts)} with the cycle continued by the next operator process '
                          f'(allowed: what the handlers saw is kept in memory only)'
                          f'{"; e.g. " + ", ".join(across_restarts[:5]) if across_restarts else ""}'))

    results.extend(_namespace_churn(soak, final_state, final_namespaces))

    late = _after_deletion(soak)
    results.append(Result('no timers or daemons start after the deletion', not late,
                          f'{len(late)} calls after the deletion handler'
                          f'{"; e.g. " + ", ".join(late[:5]) if late else ""}'))

    warm, after = soak.rss_after_warmup, soak.rss_after_run
    rss_holds = warm is not None and after is not None and after <= warm * 1.2
    growth = f'{(after / warm - 1) * 100:+.1f}%' if warm and after else 'unknown'
    results.append(Result('RSS after the run within 20% of after the warm-up', rss_holds,
                          f'{warm} kB after the warm-up, {after} kB after the run ({growth})'))

    summary = (sampling.summarize(sampling.load(soak.samples_path), warmed_up_at=soak.warmed_up_at)
               if soak.warmed_up_at is not None and soak.samples_path.exists() else None)
    if summary is None:
        results.append(Result('open fds flat after the warm-up', True, 'not sampled (--sample-interval 0, '
                              'or no samples on both sides of the warm-up)', applicable=False))
    else:
        results.append(Result('open fds flat after the warm-up', summary.fds_flat, summary.figures()))

    terminated = [i for i in soak.incarnations if i.ended_by in ('sigterm', 'sigint')]
    honoured = [i for i in terminated if i.exit_code == 0 and i.exited_at is not None
                and i.signal_sent_at is not None and i.exited_at - i.signal_sent_at <= 15.0]
    slowest = max((i.exited_at - i.signal_sent_at for i in terminated
                   if i.exited_at is not None and i.signal_sent_at is not None), default=0.0)
    results.append(Result('signals honoured within the grace period', len(honoured) == len(terminated) > 0,
                          f'{len(honoured)} of {len(terminated)} SIGTERMs/SIGINTs (exit code 0 within 15 s; '
                          f'the slowest took {slowest:.1f} s); {len(soak.world.kills)} SIGKILLs'))

    logs = _log_problems(soak)
    results.append(Result('no tracebacks in the operator logs', logs.tracebacks == 0 and logs.multiline == 0,
                          f'{logs.tracebacks} tracebacks, {logs.multiline} other multi-line records'
                          + _examples(logs.trace_examples, ' | ')))
    # On a real server, the only faults are its restarts: the refused connections and the disconnects.
    faults = ('the injected faults' if soak.substrate.injects_faults
              else f'the {soak.substrate.restarted} restarts (no other faults can be injected there)')
    results.append(Result('injected faults reported at WARNING, one line each', logs.above_warning == 0,
                          f'{logs.faults} one-line reports of {faults}, '
                          f'{logs.above_warning} above WARNING' + _examples(logs.fault_examples, ' | ', 2)))

    leaks_in_events = sum(str(event).count(soak.token) for event in events)
    debug_logs = sum(1 for i in soak.incarnations if i.debug)
    results.append(Result('the token never appears in logs or events',
                          logs.leaks == 0 and leaks_in_events == 0 and debug_logs > 0,
                          f'{logs.leaks} in {len(soak.incarnations)} operator logs '
                          f'({debug_logs} with --debug), {leaks_in_events} in {len(events)} events'))

    all_records = soak.journal.records + soak.journal.activities
    calls = collections.Counter(record['handler'] for record in all_records)
    injected = ', '.join(f'{count} {kind}' for kind, count in sorted(soak.world.faults.items()))
    print(f'Handler calls: {dict(sorted(calls.items()))}')
    operator_conflicts = sum(i.log_path.read_text(errors='replace').count(CONFLICT_FALLBACK)
                             for i in soak.incarnations)
    if not soak.substrate.injects_faults:
        injected = f'none injected (not possible on {soak.substrate.name})'
    print(f'Faults: {injected}; {soak.world.api_restarts} {soak.substrate.restarted} restarts; '
          f'{soak.world.writes_by_writer} concurrent writes ({soak.world.conflicts_seen_by_writer} got 409; '
          f'the operator got {operator_conflicts} on its guarded writes of the finalizer)')
    return [Result(result.name, True, f'not applicable on {soak.substrate.name}: {reason}', applicable=False)
            if (reason := soak.substrate.not_applicable.get(result.name)) is not None else result
            for result in results]


def report(results: list[Result], known_failures: frozenset[str], seed: int) -> int:
    failed = 0
    print(f'Invariants (seed {seed}):')
    for result in results:
        if not result.applicable:
            verdict = 'N/A '
        elif result.holds:
            verdict = 'OK  '
        elif result.name in known_failures:
            verdict = 'KNOWN FAILURE'
        else:
            verdict = 'FAIL'
            failed += 1
        print(f'  {verdict} {result.name}: {result.figures}')
    return 1 if failed else 0
