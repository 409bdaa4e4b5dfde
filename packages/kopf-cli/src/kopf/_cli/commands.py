"""
The ``kopf`` command and its sub-commands: ``run``, ``freeze``, ``resume``.

Every option can also come from an environment variable named ``KOPF_<COMMAND>_<OPTION>``,
e.g. ``KOPF_RUN_NAMESPACE=default`` or ``KOPF_RUN_VERBOSE=1`` (click's automatic variables).

Errors are reported as one short message on stderr with a non-zero exit code: 2 for the misuse
of the command line, 1 for everything else (a source that cannot be loaded, a cluster that
cannot be reached, an operator that has failed); 130 for a repeated Ctrl+C (SIGINT/SIGTERM), which exits
at once, without waiting for the sync handlers that still run in their threads (the first signal
exits gracefully, says what it waits for, and ends with 0). The command shows no tracebacks of its own
unless ``--debug`` is given (then the errors propagate as they are), except for the user's code
that fails while being loaded: its traceback (without the import machinery) is the message.
"""
import asyncio
import contextlib
import datetime
import importlib
import importlib.metadata
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, NoReturn, TypeVar

import click

from kopf._cli.controls import RunControls
from kopf._cli.loading import LoadingError, load_sources
from kopf._clients.errors import APIError, APIForbiddenError, APIUnauthorizedError, describe_network_error
from kopf._clients.vault import Vault
from kopf._cogs.structs.credentials import LoginError
from kopf._core.actions.loggers import LogFormat, configure
from kopf._core.intents.registries import OperatorRegistry, get_default_registry, set_default_registry

logger = logging.getLogger(__name__)

DISTRIBUTIONS = ('kopf', 'kopf-clients', 'kopf-core', 'kopf-webhooks', 'kopf-cli', 'kopf-testing')

# The priority implied by --dev: high enough to win over the deployed (production) operators.
DEV_PRIORITY = 666

_CommandFn = TypeVar('_CommandFn', bound=Callable[..., Any])


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


@click.group(
    name='kopf',
    context_settings={'help_option_names': ['-h', '--help'], 'auto_envvar_prefix': 'KOPF'},
)
@click.option('--version', is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help='Show the versions of the installed kopf distributions and exit.')
def main() -> None:
    """Kopf: the Kubernetes Operator Pythonic Framework."""


#
# Options shared by several commands.
#

def _apply_options(fn: _CommandFn, options: list[Callable[[_CommandFn], _CommandFn]]) -> _CommandFn:
    for option in reversed(options):  # so that --help lists them in the order of declaration
        fn = option(fn)
    return fn


def logging_options(fn: _CommandFn) -> _CommandFn:
    """The options of logging verbosity and format, the same for all commands."""
    return _apply_options(fn, [
        click.option('-v', '--verbose', is_flag=True,
                     help="Show what the framework does, except asyncio's & aiohttp's internals."),
        click.option('-d', '--debug', is_flag=True,
                     help="Show everything, asyncio's internals and the API traffic included; "
                          "show the tracebacks of failures."),
        click.option('-q', '--quiet', is_flag=True,
                     help='Show only the warnings and errors.'),
        click.option('--log-format', type=click.Choice([log_format.name.lower() for log_format in LogFormat],
                                                      case_sensitive=False),
                     default=LogFormat.FULL.name.lower(), show_default=True,
                     help='How the log lines look: the message only, with timestamps & levels, or JSON.'),
        click.option('--log-refkey', default=None, metavar='KEY',
                     help='In JSON logs, the key for the reference to the object a message is about.'),
        click.option('--log-prefix/--no-log-prefix', default=None,
                     help="Whether to prefix the messages about objects with the objects' names "
                          "[default: on for the text formats, off for JSON]."),
    ])


def scope_options(fn: _CommandFn) -> _CommandFn:
    """The options of which namespaces to serve."""
    return _apply_options(fn, [
        click.option('-n', '--namespace', multiple=True, metavar='PATTERN',
                     help='Serve the namespaces matching this name or pattern; can be repeated.'),
        click.option('-A', '--all-namespaces', is_flag=True,
                     help='Serve the whole cluster via the cluster-wide API endpoints.'),
    ])


def _configure_logging(
        *,
        verbose: bool,
        debug: bool,
        quiet: bool,
        log_format: str,
        log_refkey: str | None,
        log_prefix: bool | None,
) -> None:
    configure(
        debug=debug,
        verbose=verbose,
        quiet=quiet,
        log_format=LogFormat[log_format.upper()],
        log_prefix=log_prefix,
        log_refkey=log_refkey,
    )


def _parse_lease(value: str | None, option: str = '--lease') -> tuple[str | None, str] | None:
    if value is None:
        return None
    namespace, _, name = value.rpartition('/')
    if not name or '/' in namespace:
        what = 'of a Lease' if option == '--lease' else "of the sharding's Leases"
        raise click.BadParameter(f'{value!r}: expected NAME or NAMESPACE/NAME {what}.',
                                 param_hint=f"'{option}'")
    return namespace or None, name


def _check_scope(namespaces: tuple[str, ...], clusterwide: bool) -> None:
    if namespaces and clusterwide:
        raise click.UsageError('--namespace and --all-namespaces exclude each other: use only one of them.')


def _validate_liveness(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None:
        from kopf._core.engines import probing  # here: a plain `kopf --version` should not import the server
        try:
            probing.parse_liveness_endpoint(value)
        except probing.LivenessEndpointError as e:
            raise click.BadParameter(f'{value!r}: {e.problem}. Expected: {probing.EXPECTED_FORM}.',
                                     ctx=ctx, param=param) from None
    return value


def _validate_metrics(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None:
        from kopf._core.engines import metrics  # here: a plain `kopf --version` should not import the server
        try:
            metrics.parse_metrics_endpoint(value)
            metrics.check_installed()
        except metrics.MetricsEndpointError as e:
            raise click.BadParameter(str(e), ctx=ctx, param=param) from None
    return value


def _get_controls(ctx: click.Context) -> RunControls:
    return ctx.obj if isinstance(ctx.obj, RunControls) else RunControls()


def _fail(controls: RunControls, message: str, cause: BaseException) -> NoReturn:
    """Report a failure as a message & exit code 1; keep the original error for in-process callers."""
    controls.failure = cause
    raise click.ClickException(message) from cause


#
# kopf run
#

@main.command()
@logging_options
@scope_options
@click.option('--standalone', is_flag=True,
              help='Do not peer with other operators, not even by auto-detection.')
@click.option('--dev', is_flag=True,
              help=f'The development mode: implies --priority={DEV_PRIORITY}.')
@click.option('-L', '--liveness', metavar='URL', callback=_validate_liveness,
              help='Serve the health checks at this http:// URL, e.g. http://0.0.0.0:8080/healthz.')
@click.option('--metrics', metavar='URL', callback=_validate_metrics,
              help='Serve the Prometheus metrics at this http:// URL, e.g. http://0.0.0.0:9090/metrics '
                   '(needs prometheus-client: pip install "kopf[metrics]").')
@click.option('-P', '--peering', default=None, metavar='NAME',
              help='The peering object to use (it becomes mandatory): KopfPeering in every served '
                   'namespace, or ClusterKopfPeering with --all-namespaces.')
@click.option('-p', '--priority', type=int, default=None,
              help='The priority of this operator in the peering (0 by default): '
                   'the operators with lower priorities pause while this one runs.')
@click.option('--lease', default=None, metavar='[NAMESPACE/]NAME',
              help='Elect the leader with this Lease (coordination.k8s.io/v1; the namespace is "default" '
                   'unless given): only the leader handles the objects. No CRDs needed (unlike peering).')
@click.option('--shards', default=None, metavar='[NAMESPACE/]NAME',
              help='Split the objects among the replicas through the Leases NAME-shard-N and NAME-member-ID '
                   '(coordination.k8s.io/v1; the namespace is "default" unless given); instead of --lease. '
                   'The number of shards is settings.sharding.count (32).')
@click.option('-m', '--module', multiple=True, metavar='MODULE',
              help='Import this module by name, as "python -m" does; can be repeated.')
@click.argument('paths', nargs=-1, type=click.Path(exists=True, dir_okay=False))
@click.pass_context
def run(
        ctx: click.Context,
        *,
        paths: tuple[str, ...],
        module: tuple[str, ...],
        verbose: bool,
        debug: bool,
        quiet: bool,
        log_format: str,
        log_refkey: str | None,
        log_prefix: bool | None,
        namespace: tuple[str, ...],
        all_namespaces: bool,
        standalone: bool,
        dev: bool,
        liveness: str | None,
        metrics: str | None,
        peering: str | None,
        priority: int | None,
        lease: str | None,
        shards: str | None,
) -> None:
    """
    Load the handlers from the files and modules and run the operator with them.

    Every option can also come from an environment variable named KOPF_RUN_ and the option's long
    name in capitals, e.g. KOPF_RUN_NAMESPACE=default, KOPF_RUN_VERBOSE=1, KOPF_RUN_LIVENESS=URL.
    """
    # The parameters are named after the options (not as what they mean), since the names of
    # the environment variables are made from them: KOPF_RUN_NAMESPACE, KOPF_RUN_ALL_NAMESPACES.
    _check_scope(namespace, all_namespaces)
    lease_reference = _parse_lease(lease)
    sharding_reference = _parse_lease(shards, '--shards')
    if lease_reference is not None and sharding_reference is not None:
        raise click.UsageError('--lease and --shards exclude each other: the sharding replaces the single '
                               'leader of the election; use only one of them.')
    _configure_logging(verbose=verbose, debug=debug, quiet=quiet,
                       log_format=log_format, log_refkey=log_refkey, log_prefix=log_prefix)
    controls = _get_controls(ctx)
    if lease_reference is not None or sharding_reference is not None or metrics is not None:
        from kopf._core.intents.configuration import OperatorSettings
        controls.settings = controls.settings if controls.settings is not None else OperatorSettings()
    if lease_reference is not None:
        assert controls.settings is not None
        controls.settings.election.lease_namespace, controls.settings.election.lease_name = lease_reference
    if sharding_reference is not None:
        assert controls.settings is not None
        controls.settings.sharding.namespace, controls.settings.sharding.name = sharding_reference
    if metrics is not None:
        assert controls.settings is not None
        controls.settings.metrics.endpoint = metrics

    registry = controls.registry if controls.registry is not None else get_default_registry()
    loading_error: LoadingError | None = None
    try:
        with _default_registry(registry):
            load_sources(paths=paths, modules=module)
    except LoadingError as e:
        loading_error = e
    if loading_error is not None:  # outside of the except-block: to not chain the errors when re-raising
        original_error = loading_error.__cause__ or loading_error
        if debug:
            raise original_error  # with its full traceback, the loading machinery included
        _fail(controls, str(loading_error), original_error)
    if not _has_handlers(registry):
        logger.warning('No handlers are registered by the given files and modules: '
                       'the operator has nothing to do. Forgot a file, or -m before a module name?')

    from kopf._core.reactor import running  # here: a plain `kopf --version` should not import the reactor

    own_loop = controls.loop is None  # the command closes only the loop it has made itself
    loop = controls.loop if controls.loop is not None else _make_loop()
    try:
        with _sync_handlers_awaited():
            _run_operator(running, loop=loop, own_loop=own_loop, controls=controls, registry=registry,
                          debug=debug, standalone=standalone, dev=dev, priority=priority, peering=peering,
                          liveness=liveness, all_namespaces=all_namespaces, namespace=namespace)
    except KeyboardInterrupt:  # a signal while our handlers are not installed (e.g. right after the operator)
        _exit_at_once()


def _run_operator(running: Any, *, loop: asyncio.AbstractEventLoop, own_loop: bool, controls: RunControls,
                  registry: OperatorRegistry, debug: bool, standalone: bool, dev: bool, priority: int | None,
                  peering: str | None, liveness: str | None, all_namespaces: bool,
                  namespace: tuple[str, ...]) -> None:
    try:
        running.run(
            loop=loop,
            registry=registry,
            settings=controls.settings,
            vault=controls.vault,
            memo=controls.memo,
            stop_flag=controls.stop_flag,
            ready_flag=controls.ready_flag,
            standalone=True if standalone else None,  # None lets the settings decide
            priority=DEV_PRIORITY if dev else priority,
            peering_name=peering,
            liveness_endpoint=liveness,
            clusterwide=all_namespaces,
            namespaces=namespace,
        )
    except Exception as e:
        if debug:
            raise
        _fail(controls, _describe_operator_failure(e), e)
    finally:
        if own_loop and not loop.is_closed():
            _close_loop(loop)


@contextlib.contextmanager
def _sync_handlers_awaited() -> Iterator[None]:
    """
    After the operator: wait for its sync handlers still running in threads (they cannot be interrupted),
    saying so; or exit at once if asked by a repeated signal (Ctrl+C), abandoning the threads.

    Only in the main thread (where the signals arrive): the in-process runners do not exit the process.
    """
    from kopf._core.reactor import supervision
    supervision.reset_exit_requests()
    # Till the end of this block, a signal after the operator's loop is only noted, never raised (a
    # KeyboardInterrupt at a random place of the exit can be lost, e.g. in uvloop's C callbacks): checked.
    token = supervision.defaults_restored_by_loop_owner.set(True)
    interrupted = False
    try:
        try:
            yield
        except KeyboardInterrupt:
            interrupted = True  # the caller exits at once: no waiting for the threads
            raise
        finally:
            if not interrupted and threading.current_thread() is threading.main_thread():
                _await_sync_handlers()
    finally:
        supervision.defaults_restored_by_loop_owner.reset(token)
        supervision.restore_default_signal_handlers()
    if threading.current_thread() is threading.main_thread() and supervision.signal_after_operator():
        _exit_at_once()  # right before Python's defaults were back: as if it came a moment later


def _await_sync_handlers() -> None:
    """Wait for the sync handlers' threads, but exit at once when a signal comes (checked on every step)."""
    from kopf._core.actions import invocation
    from kopf._core.reactor import supervision
    while True:
        if supervision.forced_exit_requested():  # by a repeated signal while the loop was still running
            _exit_at_once(said=True)
        if supervision.signal_after_operator():  # too late for the operator's loop: as if a moment later
            _exit_at_once()
        calls = invocation.running_sync_calls()
        if not calls:
            break
        supervision.announce_sync_calls(calls, once=True)
        time.sleep(0.1)  # the signals are only noted meanwhile (they do not interrupt it): checked above


def _exit_at_once(*, said: bool = False) -> NoReturn:
    """Exit the process now with the code of an interrupted command, abandoning the sync handlers' threads."""
    from kopf._core.actions import invocation
    from kopf._core.reactor import supervision
    calls = invocation.running_sync_calls()
    if calls and not said:  # unless said by the signal handler already
        supervision.logger.warning(f'Exiting now, abandoning the sync handlers: '
                                   f'{supervision.describe_sync_calls(calls)}.')
    # The threads cannot be stopped, and the interpreter would wait for them at exit: os._exit() does not.
    logging.shutdown()  # flushes the logs
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(supervision.FORCED_EXIT_CODE)


# The default registry is global: loading in several threads at once (e.g. parallel KopfRunners)
# must not mix the registries of the others.
_loading_lock = threading.Lock()


@contextlib.contextmanager
def _default_registry(registry: OperatorRegistry) -> Iterator[None]:
    """Make a registry the default one, so that the decorators in the loaded sources fill it."""
    with _loading_lock:
        previous = get_default_registry()
        set_default_registry(registry)
        try:
            yield
        finally:
            set_default_registry(previous)


def _has_handlers(registry: OperatorRegistry) -> bool:
    return any(_iter_handler_counts(registry))


def _iter_handler_counts(registry: OperatorRegistry) -> Iterator[int]:
    yield len(registry.activities)
    yield len(registry.watching)
    yield len(registry.changing)
    yield len(registry.spawning)
    yield len(registry.indexing)
    yield len(registry.webhooks)


def _make_loop() -> asyncio.AbstractEventLoop:
    """A uvloop event loop if uvloop is installed (it is faster); otherwise, a standard one."""
    try:
        uvloop = importlib.import_module('uvloop')
    except ImportError:
        loop = asyncio.new_event_loop()
    else:
        loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)  # for the code that looks it up instead of receiving it
    return loop


def _close_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Close the loop as ``asyncio.run()`` does; the operator has stopped its own tasks by now."""
    from kopf._core.reactor import supervision
    try:
        loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        asyncio.set_event_loop(None)
        # Even if the operator's exit has not removed its signal handlers yet: the standard loop removes them
        # when closed, other loops (e.g. uvloop) leave them, and a repeated Ctrl+C would be ignored then.
        supervision.remove_signal_handlers(loop)
        loop.close()


def _describe_operator_failure(exception: Exception) -> str:
    from kopf._core.engines.peering import PeeringError
    hint = ' (Run with --debug to see the traceback.)'
    if isinstance(exception, PeeringError):
        return str(exception)  # it says what to do
    if isinstance(exception, LoginError):
        return f'Cannot log in to the Kubernetes cluster: {exception}'
    if isinstance(exception, APIUnauthorizedError):
        return (f'Cannot log in to the Kubernetes cluster: the API server rejected the credentials '
                f'(401 Unauthorized) for {exception.method} {exception.url}: '
                f'{exception.message or "no explanation"}')
    if isinstance(exception, APIForbiddenError):
        # The credentials are accepted, but their user has no permissions: the fix is in the RBAC.
        return (f'The Kubernetes API has denied the access (403 Forbidden) for {exception.method} '
                f'{exception.url}: {exception.message or "no explanation"}; grant the RBAC permissions '
                f'to the operator\'s user or service account (see https://docs.kopf.dev/en/stable/deployment/).')
    if isinstance(exception, ConnectionError):  # incl. the client's network errors
        return f'Cannot reach the Kubernetes API: {describe_network_error(exception)}'
    if isinstance(exception, APIError):
        return f'The Kubernetes API has failed a request: {exception}'
    return f'The operator has failed: {type(exception).__name__}: {exception}.{hint}'


#
# kopf freeze / kopf resume
#

def _peering_command(fn: _CommandFn) -> _CommandFn:
    """The options shared by the commands that talk to the operators via the peering objects."""
    fn = _apply_options(fn, [
        click.option('-i', '--id', default=None,
                     help='The identity to use in the peering object (by default, this host & user).'),
    ])
    return scope_options(logging_options(fn))


@main.command()
@_peering_command
@click.option('--dev', is_flag=True, help=f'The development mode: implies --priority={DEV_PRIORITY}.')
@click.option('-P', '--peering', required=True, metavar='NAME',
              help='The peering object via which to freeze the operators.')
@click.option('-p', '--priority', type=int, default=100, show_default=True,
              help='The priority to freeze with: the operators with lower priorities pause.')
@click.option('-t', '--lifetime', type=int, required=True, metavar='SECONDS',
              help='For how long to freeze the operators.')
@click.option('-m', '--message', default=None, help='Why the operators are frozen (for humans).')
@click.pass_context
def freeze(ctx: click.Context, /, **options: Any) -> None:
    """Pause the handling of resources in the operators of a peering (for a time)."""
    _check_scope(options['namespace'], options['all_namespaces'])
    priority = DEV_PRIORITY if options['dev'] else options['priority']
    _run_peering_command(ctx, options, priority=priority, lifetime=options['lifetime'],
                         message=options['message'])


@main.command()
@_peering_command
@click.option('-P', '--peering', required=True, metavar='NAME',
              help='The peering object via which to resume the operators.')
@click.pass_context
def resume(ctx: click.Context, /, **options: Any) -> None:
    """Resume the handling of resources in the operators of a peering, if frozen."""
    _check_scope(options['namespace'], options['all_namespaces'])
    _run_peering_command(ctx, options, priority=None, lifetime=None, message=None)


def _run_peering_command(ctx: click.Context, options: dict[str, Any], *, priority: int | None,
                         lifetime: int | None, message: str | None) -> None:
    """
    Add (freeze) or remove (resume) this command's own record in the peering objects, as an operator would
    (the login handlers are the default ones); a peering that does not exist is an error.
    """
    _configure_logging(verbose=options['verbose'], debug=options['debug'], quiet=options['quiet'],
                       log_format=options['log_format'], log_refkey=options['log_refkey'],
                       log_prefix=options['log_prefix'])
    controls = _get_controls(ctx)
    from kopf._core.engines import peering as peering_engine  # here: no reactor for `kopf --version`
    from kopf._core.intents.configuration import OperatorSettings
    from kopf._core.reactor import running
    settings = controls.settings if controls.settings is not None else OperatorSettings()
    clusterwide = bool(options['all_namespaces'])
    namespaces: list[str | None] = [None] if clusterwide else list(options['namespace'] or ['default'])
    identity = options['id'] or peering_engine.detect_own_id(manual=True)
    vault = controls.vault if controls.vault is not None else Vault()
    settings.peering.name = options['peering']
    settings.peering.clusterwide = clusterwide
    settings.peering.mandatory = True

    async def command() -> None:
        for namespace in namespaces:
            target = await peering_engine.detect_peering(settings=settings, vault=vault, namespace=namespace)
            assert target is not None  # mandatory: an error otherwise
            record = None
            if priority is not None and lifetime is not None:
                record = peering_engine.Peer(id=peering_engine.Identity(identity), priority=priority,
                                             lifetime=lifetime, lastseen=datetime.datetime.now(datetime.UTC))
            await peering_engine.touch(settings=settings, vault=vault, target=target, id=identity,
                                       peer=record)
            if record is not None:
                suffix = f': {message}' if message else '.'
                logger.info(f'Frozen the operators of the peering {target} with the priority {priority} '
                            f'for {lifetime}s as {identity!r}{suffix}')
            else:
                logger.info(f'Resumed the operators of the peering {target} (removed {identity!r}).')

    loop = controls.loop if controls.loop is not None else _make_loop()
    try:
        running.run(loop=loop, registry=OperatorRegistry(), settings=settings, vault=vault,
                    clusterwide=clusterwide,
                    namespaces=[] if clusterwide else options['namespace'] or ['default'],
                    _command=command())
    except Exception as e:
        if options['debug']:
            raise
        _fail(controls, _describe_operator_failure(e), e)
    finally:
        if controls.loop is None and not loop.is_closed():
            _close_loop(loop)
