import concurrent.futures
import dataclasses

import pytest

from kopf._cogs.configs.networking import ClientSettings, NetworkingSettings, WatchingSettings
from kopf._core.intents.configuration import ExecutionSettings, OperatorSettings, QueueingSettings

# The defaults of Kopf 1.45.2, section by section (the executor and the storages are checked separately).
EXPECTED_DEFAULTS = [
    ('process', 'ultimate_exiting_timeout', 600),
    ('posting', 'enabled', True),
    ('posting', 'loggers', False),
    ('posting', 'level', 20),
    ('posting', 'default_backoffs', (1, 1, 2, 3, 5, 8, 13, 21)),
    ('posting', 'logging_backoffs', (1, 1, 2, 3, 5)),
    ('posting', 'worker_limit', None),
    ('posting', 'idle_timeout', 1.0),
    ('posting', 'reporting_component', 'kopf'),
    ('posting', 'reporting_instance', 'dev'),
    ('posting', 'event_name_prefix', 'kopf-event-'),
    ('peering', 'name', 'default'),
    ('peering', 'stealth', False),
    ('peering', 'priority', 0),
    ('peering', 'lifetime', 60),
    ('peering', 'mandatory', False),
    ('peering', 'standalone', False),
    ('peering', 'clusterwide', False),
    ('watching', 'server_timeout', None),
    ('watching', 'client_timeout', None),
    ('watching', 'connect_timeout', None),
    ('watching', 'reconnect_backoff', 0.1),
    ('watching', 'inactivity_timeout', 70.0),
    ('watching', 'chunk_size', None),
    ('watching', 'initial_streaming', False),
    ('watching', 'label_selectors', {}),
    ('watching', 'field_selectors', {}),
    ('watching', 'shard_selectors', {}),
    ('queueing', 'worker_limit', None),
    ('queueing', 'idle_timeout', 5.0),
    ('queueing', 'exit_timeout', 2.0),
    ('queueing', 'error_delays', (1, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 610)),
    ('queueing', '_batch_window', 0.1),
    ('scanning', 'disabled', False),
    ('admission', 'server', None),
    ('admission', 'managed', None),
    ('execution', 'default_backoff', 60),
    ('execution', '_max_workers', None),
    ('background', 'cancellation_polling', 60),
    ('background', 'instant_exit_timeout', None),
    ('background', 'instant_exit_zero_time_cycles', 10),
    ('networking', 'request_timeout', 300),
    ('networking', 'connect_timeout', None),
    ('networking', 'error_backoffs', (1, 1, 2, 3, 5, 8, 13, 21)),
    ('networking', 'enforce_retry_after', False),
    ('networking', 'trust_env', False),
    ('persistence', 'finalizer', 'kopf.zalando.org/KopfFinalizerMarker'),
    ('persistence', 'consistency_timeout', 5.0),
]


@pytest.mark.parametrize('section, name, expected', EXPECTED_DEFAULTS)
def test_defaults(section, name, expected):
    settings = OperatorSettings()
    value = getattr(getattr(settings, section), name)
    assert value == expected
    assert isinstance(value, type(expected))


def test_sections_are_as_in_kopf():
    # Kopf's sections in Kopf's order (also positionally); ours beyond Kopf only after them.
    names = [field.name for field in dataclasses.fields(OperatorSettings)]
    assert names[:12] == ['process', 'posting', 'peering', 'watching', 'queueing', 'scanning',
                          'admission', 'execution', 'background', 'networking', 'persistence',
                          'election']
    assert names[12:] == ['metrics', 'tracing', 'sharding']  # ours, beyond Kopf's


def test_election_defaults_are_those_of_client_go():
    settings = OperatorSettings()
    assert settings.election.lease_name is None  # disabled
    assert settings.election.lease_namespace is None  # "default"
    assert (settings.election.lease_duration, settings.election.renew_deadline,
            settings.election.retry_period) == (15, 10, 2)


def test_sections_are_not_shared_between_operators():
    settings1 = OperatorSettings()
    settings2 = OperatorSettings()
    settings1.posting.level = 40
    settings1.watching.label_selectors['pods'] = 'x=y'
    assert settings2.posting.level == 20
    assert settings2.watching.label_selectors == {}


def test_execution_settings_are_comparable_while_their_executors_are_not_created():
    assert OperatorSettings().execution == OperatorSettings().execution
    assert ExecutionSettings(max_workers=1) != ExecutionSettings(max_workers=2)
    settings1, settings2 = OperatorSettings(), OperatorSettings()
    executor = settings1.execution.executor
    assert settings1.execution != settings2.execution
    settings2.execution.executor = executor
    assert settings1.execution == settings2.execution
    executor.shutdown()


def test_client_sections_are_reused_and_the_protocol_is_satisfied():
    settings: ClientSettings = OperatorSettings()
    assert isinstance(settings.networking, NetworkingSettings)
    assert isinstance(settings.watching, WatchingSettings)


def test_batching_is_the_former_name_of_queueing():
    settings = OperatorSettings()
    assert settings.batching is settings.queueing
    settings.batching.error_delays = [10, 20]
    assert settings.queueing.error_delays == [10, 20]
    replacement = QueueingSettings(idle_timeout=1.0)
    settings.batching = replacement
    assert settings.queueing is replacement


def test_batch_window_property():
    settings = OperatorSettings()
    assert settings.queueing.batch_window == 0.1
    settings.queueing.batch_window = 0.5
    assert settings.queueing._batch_window == 0.5


def test_peering_namespaced_is_the_opposite_of_clusterwide():
    settings = OperatorSettings()
    assert settings.peering.namespaced is True
    settings.peering.namespaced = False
    assert settings.peering.clusterwide is True


def test_persistence_storages_come_from_the_persistence_layer_if_present():
    settings = OperatorSettings()
    try:
        import kopf._core.persistence.diffbase as diffbase
        import kopf._core.persistence.progress as progress
    except ModuleNotFoundError:
        assert settings.persistence.progress_storage is None
        assert settings.persistence.diffbase_storage is None
    else:
        assert isinstance(settings.persistence.progress_storage, progress.SmartProgressStorage)
        assert isinstance(settings.persistence.diffbase_storage, diffbase.AnnotationsDiffBaseStorage)


def test_executor_is_created_lazily_with_the_default_size():
    execution = ExecutionSettings()
    assert execution._executor is None  # no threads are started merely by creating the settings
    executor = execution.executor
    assert isinstance(executor, concurrent.futures.ThreadPoolExecutor)
    assert execution.executor is executor  # created once
    assert execution.max_workers is None
    executor.shutdown()


def test_max_workers_before_the_executor_is_used():
    execution = ExecutionSettings()
    execution.max_workers = 3
    assert execution.max_workers == 3
    assert execution._executor is None
    executor = execution.executor
    assert executor._max_workers == 3
    executor.shutdown()


def test_max_workers_replaces_the_own_executor_and_shuts_the_old_one_down():
    execution = ExecutionSettings()
    old = execution.executor
    future = old.submit(lambda: 123)
    execution.max_workers = 7
    new = execution.executor
    assert new is not old
    assert new._max_workers == 7
    assert future.result(timeout=5) == 123  # the work in the old executor is finished there
    with pytest.raises(RuntimeError):
        old.submit(lambda: None)  # the old one is shut down
    new.shutdown()


def test_max_workers_replaces_a_custom_executor_but_leaves_it_running():
    execution = ExecutionSettings()
    custom = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    execution.executor = custom
    assert execution.executor is custom
    execution.max_workers = 2
    assert execution.executor is not custom
    assert execution.executor._max_workers == 2
    assert custom.submit(lambda: 'still usable').result(timeout=5) == 'still usable'
    custom.shutdown()
    execution.executor.shutdown()


@pytest.mark.parametrize('value, error', [
    (0, ValueError),
    (-1, ValueError),
    (1.5, ValueError),
    (True, ValueError),
    ('10', ValueError),
])
def test_max_workers_must_be_positive_integers(value, error):
    execution = ExecutionSettings()
    with pytest.raises(error, match='max_workers must be a positive integer or None'):
        execution.max_workers = value
    assert execution.max_workers is None


def test_max_workers_can_be_reset_to_the_default():
    execution = ExecutionSettings(max_workers=2)
    execution.max_workers = None
    assert execution.max_workers is None


def test_seats_and_lending_delay_defaults():
    # Beyond Kopf: the bounds of the framework's own work (see ARCHITECTURE.md, "How work is bounded").
    settings = OperatorSettings()
    assert settings.queueing.processing_seats == 100
    assert settings.queueing.processing_reserve is None  # 9 per seat
    assert settings.background.timer_seats == 400
    assert settings.execution.lending_delay == 0.05
    assert settings.networking.max_concurrent_requests == 100  # per credential; as many as the seats


@pytest.mark.parametrize('section, name, value', [
    ('queueing', 'processing_seats', 1),
    ('queueing', 'processing_seats', 10_000),
    ('queueing', 'processing_reserve', 0),
    ('queueing', 'processing_reserve', 5_000),
    ('queueing', 'processing_reserve', None),
    ('background', 'timer_seats', 1),
    ('networking', 'max_concurrent_requests', 1),
    ('networking', 'max_concurrent_requests', 1_000),
    ('execution', 'lending_delay', 0),
    ('execution', 'lending_delay', 2),
    ('execution', 'lending_delay', 0.5),
])
def test_seats_and_lending_delay_accept_good_values(section, name, value):
    settings = OperatorSettings()
    setattr(getattr(settings, section), name, value)
    assert getattr(getattr(settings, section), name) == value


SEATS_MESSAGE = 'settings.{}.{} must be a positive integer, got {}.'
DELAY_MESSAGE = 'settings.{}.{} must be a number of seconds, 0 or more, got {}.'
RESERVE_MESSAGE = 'settings.{}.{} must be an integer, 0 or more, or None for 9 per seat; got {}.'


@pytest.mark.parametrize('section, name, value, message', [
    ('queueing', 'processing_seats', 0, SEATS_MESSAGE),
    ('queueing', 'processing_seats', -5, SEATS_MESSAGE),
    ('queueing', 'processing_seats', 2.5, SEATS_MESSAGE),
    ('queueing', 'processing_seats', None, SEATS_MESSAGE),
    ('queueing', 'processing_seats', True, SEATS_MESSAGE),
    ('queueing', 'processing_reserve', -1, RESERVE_MESSAGE),
    ('queueing', 'processing_reserve', 2.5, RESERVE_MESSAGE),
    ('queueing', 'processing_reserve', False, RESERVE_MESSAGE),
    ('queueing', 'processing_reserve', '900', RESERVE_MESSAGE),
    ('background', 'timer_seats', 0, SEATS_MESSAGE),
    ('background', 'timer_seats', '400', SEATS_MESSAGE),
    ('networking', 'max_concurrent_requests', 0, SEATS_MESSAGE),
    ('networking', 'max_concurrent_requests', None, SEATS_MESSAGE),
    ('networking', 'max_concurrent_requests', 50.0, SEATS_MESSAGE),
    ('execution', 'lending_delay', -0.1, DELAY_MESSAGE),
    ('execution', 'lending_delay', float('nan'), DELAY_MESSAGE),
    ('execution', 'lending_delay', None, DELAY_MESSAGE),
])
def test_seats_and_lending_delay_refuse_bad_values_at_once(section, name, value, message):
    settings = OperatorSettings()
    before = getattr(getattr(settings, section), name)
    with pytest.raises(ValueError) as err:
        setattr(getattr(settings, section), name, value)
    assert str(err.value) == message.format(section, name, repr(value))
    assert getattr(getattr(settings, section), name) == before


def test_seats_and_lending_delay_are_checked_on_creation_too():
    with pytest.raises(ValueError, match=r'^settings.queueing.processing_seats must be a positive integer'):
        QueueingSettings(processing_seats=0)
    with pytest.raises(ValueError, match=r'^settings.execution.lending_delay must be a number of seconds'):
        ExecutionSettings(lending_delay=-1)
    with pytest.raises(ValueError, match=r'^settings.networking.max_concurrent_requests must be a positive'):
        NetworkingSettings(max_concurrent_requests=0)
    assert ExecutionSettings(lending_delay=1) != ExecutionSettings(lending_delay=2)
    assert ExecutionSettings(lending_delay=1) == ExecutionSettings(lending_delay=1)
