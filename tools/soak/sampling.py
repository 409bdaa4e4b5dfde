"""
The soak's samples of the running operator (every ``--sample-interval`` seconds, ``WORKDIR/samples.jsonl``):
its resident memory (``VmRSS``), open file descriptors (``/proc/PID/fd``), threads, and the asyncio tasks
alive in its event loop (counted by the operator itself: ``SOAK_TASKS``, see ``operator.py``).

One JSON line per sample: the wall-clock time, the seconds since the soak's start, the incarnation's
number and pid, ``rss_kb``, ``fds``, ``threads``, ``tasks`` (``null`` until the operator has counted them).
``python -m tools.soak.plot WORKDIR OUT.png`` draws them; ``summarize()`` gives the summary's figures.
"""
import dataclasses
import json
import os
import pathlib
from collections.abc import Iterable
from typing import Any

# Open fds of the last incarnation after its warm-up may exceed the warm-up's peak by this much (the
# connections of the pool and the watch-streams come and go); a leak (e.g. a socket per reconnection or
# per handled object) exceeds it within minutes.
FDS_SLACK = 10


def sample_process(pid: int, tasks_path: pathlib.Path | None = None) -> dict[str, Any] | None:
    """RSS, fds, threads (and the tasks as last counted by the process) of a process; ``None`` if gone."""
    try:
        with open(f'/proc/{pid}/status') as f:
            status = dict(line.split(':', 1) for line in f.read().splitlines() if ':' in line)
        sample: dict[str, Any] = {
            'rss_kb': int(status['VmRSS'].split()[0]),
            'fds': len(os.listdir(f'/proc/{pid}/fd')),
            'threads': int(status['Threads']),
        }
    except (OSError, KeyError, ValueError):  # exited (or a zombie without VmRSS)
        return None
    sample['tasks'] = read_tasks(tasks_path) if tasks_path is not None else None
    return sample


def read_tasks(path: pathlib.Path) -> int | None:
    """The operator's last count of its asyncio tasks (``COUNT TIME``), or ``None`` if not counted yet."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return None


def load(path: pathlib.Path) -> list[dict[str, Any]]:
    """The samples of a run: ``WORKDIR/samples.jsonl`` (or that file itself)."""
    if path.is_dir():
        path = path / 'samples.jsonl'
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]


@dataclasses.dataclass(frozen=True)
class Summary:
    """The last incarnation's figures: during its warm-up, and after it (until the end of the run)."""

    incarnation: int
    samples: int  # after the warm-up
    rss_warm_kb: int  # the first sample after the warm-up
    rss_end_kb: int  # the last sample
    rss_max_kb: int  # the peak after the warm-up
    fds_warmup_max: int  # the peak during the warm-up (the initial listing: the most connections at once)
    fds_min: int
    fds_max: int
    threads_min: int
    threads_max: int
    tasks_min: int | None
    tasks_max: int | None

    @property
    def rss_growth(self) -> float:
        return (self.rss_end_kb / self.rss_warm_kb - 1) * 100

    @property
    def fds_flat(self) -> bool:
        return self.fds_max <= self.fds_warmup_max + FDS_SLACK

    def figures(self) -> str:
        tasks = (f'tasks {self.tasks_min}..{self.tasks_max}' if self.tasks_min is not None
                 else 'tasks not counted')
        return (f'incarnation #{self.incarnation}, {self.samples} samples after its warm-up: '
                f'RSS {self.rss_warm_kb} kB -> {self.rss_end_kb} kB ({self.rss_growth:+.1f}%; '
                f'peak {self.rss_max_kb} kB); fds {self.fds_min}..{self.fds_max} (peak {self.fds_warmup_max} '
                f'in the warm-up, +{FDS_SLACK} allowed); '
                f'threads {self.threads_min}..{self.threads_max}; {tasks}')


def summarize(samples: Iterable[dict[str, Any]], *, warmed_up_at: float) -> Summary | None:
    """
    The figures of the last incarnation sampled, split at its warm-up's end (a wall-clock time).

    ``None`` if it has no samples on both sides of that time (sampling disabled, or too short a run).
    """
    samples = list(samples)
    if not samples:
        return None
    last = max(sample['incarnation'] for sample in samples)
    own = [sample for sample in samples if sample['incarnation'] == last]
    warmup = [sample for sample in own if sample['time'] <= warmed_up_at]
    after = [sample for sample in own if sample['time'] > warmed_up_at]
    if not warmup or not after:
        return None
    tasks = [sample['tasks'] for sample in after if sample.get('tasks') is not None]
    return Summary(
        incarnation=last,
        samples=len(after),
        rss_warm_kb=after[0]['rss_kb'],
        rss_end_kb=after[-1]['rss_kb'],
        rss_max_kb=max(sample['rss_kb'] for sample in after),
        fds_warmup_max=max(sample['fds'] for sample in warmup),
        fds_min=min(sample['fds'] for sample in after),
        fds_max=max(sample['fds'] for sample in after),
        threads_min=min(sample['threads'] for sample in after),
        threads_max=max(sample['threads'] for sample in after),
        tasks_min=min(tasks, default=None),
        tasks_max=max(tasks, default=None),
    )
