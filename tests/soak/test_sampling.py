"""
The soak's samples of the operator (``tools/soak/sampling.py``): what is read from ``/proc`` and the
operator's count of its tasks, and the summary of the last incarnation after its warm-up (the figures of
the invariant "open fds flat after the warm-up"). Not a soak: plain functions on made-up samples.
"""
import importlib.util
import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Loaded by its path: the repository's root is not on sys.path under `pytest` (--import-mode=importlib).
_spec = importlib.util.spec_from_file_location('soak_sampling', ROOT / 'tools' / 'soak' / 'sampling.py')
assert _spec is not None and _spec.loader is not None
sampling = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = sampling
_spec.loader.exec_module(sampling)


def _sample(time: float, incarnation: int, *, rss: int = 60_000, fds: int = 50,
            threads: int = 4, tasks: int | None = 100) -> dict[str, object]:
    return {'time': time, 'elapsed': time, 'incarnation': incarnation, 'pid': 1000 + incarnation,
            'rss_kb': rss, 'fds': fds, 'threads': threads, 'tasks': tasks}


def test_a_running_process_is_sampled_with_the_tasks_it_counted(tmp_path: pathlib.Path) -> None:
    tasks_path = tmp_path / 'tasks-1.txt'
    tasks_path.write_text('123 1795900000.5\n')  # as the soak's operator writes it
    sample = sampling.sample_process(os.getpid(), tasks_path)
    assert sample is not None
    assert sample['rss_kb'] > 1000
    assert sample['fds'] >= 3  # stdin, stdout, stderr at least
    assert sample['threads'] >= 1
    assert sample['tasks'] == 123


def test_the_tasks_are_none_until_counted(tmp_path: pathlib.Path) -> None:
    sample = sampling.sample_process(os.getpid(), tmp_path / 'tasks-1.txt')
    assert sample is not None
    assert sample['tasks'] is None


def test_an_exited_process_gives_no_sample() -> None:
    process = subprocess.Popen([sys.executable, '-c', 'pass'])
    process.wait()
    assert sampling.sample_process(process.pid) is None


def test_the_summary_is_of_the_last_incarnation_split_at_its_warmup(tmp_path: pathlib.Path) -> None:
    samples = [
        _sample(10, 1, rss=90_000, fds=300, tasks=999),  # an earlier incarnation: not summarized
        _sample(20, 2, rss=50_000, fds=40, threads=2, tasks=None),  # the warm-up
        _sample(30, 2, rss=60_000, fds=80, threads=4, tasks=500),  # the warm-up's peak of fds
        _sample(40, 2, rss=62_000, fds=70, threads=4, tasks=480),
        _sample(50, 2, rss=64_000, fds=85, threads=5, tasks=520),
        _sample(60, 2, rss=63_000, fds=60, threads=4, tasks=None),
    ]
    path = tmp_path / 'samples.jsonl'
    path.write_text(''.join(json.dumps(sample) + '\n' for sample in samples))
    summary = sampling.summarize(sampling.load(tmp_path), warmed_up_at=30)
    assert summary is not None
    assert summary.incarnation == 2
    assert summary.samples == 3
    assert (summary.rss_warm_kb, summary.rss_end_kb, summary.rss_max_kb) == (62_000, 63_000, 64_000)
    assert round(summary.rss_growth, 2) == 1.61
    assert summary.fds_warmup_max == 80
    assert (summary.fds_min, summary.fds_max) == (60, 85)
    assert (summary.threads_min, summary.threads_max) == (4, 5)
    assert (summary.tasks_min, summary.tasks_max) == (480, 520)
    assert summary.fds_flat  # 85 <= 80 + the slack
    assert 'fds 60..85' in summary.figures() and 'tasks 480..520' in summary.figures()


def test_growing_fds_after_the_warmup_are_not_flat() -> None:
    leak = sampling.FDS_SLACK + 1
    samples = [_sample(10, 1, fds=80), _sample(20, 1, fds=80), _sample(30, 1, fds=80 + leak)]
    summary = sampling.summarize(samples, warmed_up_at=10)
    assert summary is not None
    assert not summary.fds_flat


def test_no_summary_without_samples_on_both_sides_of_the_warmup() -> None:
    assert sampling.summarize([], warmed_up_at=10) is None
    assert sampling.summarize([_sample(20, 1), _sample(30, 1)], warmed_up_at=10) is None
    assert sampling.summarize([_sample(5, 1), _sample(8, 1)], warmed_up_at=10) is None
    # The last incarnation's own warm-up: an earlier incarnation's samples before it do not count.
    assert sampling.summarize([_sample(5, 1), _sample(20, 2)], warmed_up_at=10) is None


def test_tasks_not_counted_are_reported_so() -> None:
    summary = sampling.summarize([_sample(5, 1, tasks=None), _sample(20, 1, tasks=None)], warmed_up_at=10)
    assert summary is not None
    assert summary.tasks_min is None and summary.tasks_max is None
    assert 'tasks not counted' in summary.figures()
