"""
Sample the soak's operator processes from the outside: RSS, peak RSS, open file descriptors, threads.

Usage: ``python -m tools.soak.sampler SAMPLES.jsonl [--interval 10]`` beside a running soak (until killed).
Every interval, each process whose command line runs ``tools/soak/operator.py`` under ``kopf`` gets one
JSON line: the wall-clock time, its pid (an incarnation of the operator), ``rss_kb`` and ``hwm_kb``
(``VmRSS``, ``VmHWM``), ``threads``, and ``fds`` (the entries of ``/proc/PID/fd``).
``python -m tools.soak.plot`` draws them.
"""
import argparse
import json
import os
import time


def sample_once() -> list[dict[str, float]]:
    samples = []
    for pid in os.listdir('/proc'):
        if not pid.isdigit():
            continue
        try:
            with open(f'/proc/{pid}/cmdline', 'rb') as f:
                command = f.read().split(b'\0')
            if b'kopf' not in command or not any(arg.endswith(b'tools/soak/operator.py') for arg in command):
                continue
            with open(f'/proc/{pid}/status') as f:
                status = dict(line.split(':', 1) for line in f.read().splitlines() if ':' in line)
            samples.append({'time': time.time(), 'pid': int(pid),
                            'rss_kb': int(status['VmRSS'].split()[0]),
                            'hwm_kb': int(status['VmHWM'].split()[0]),
                            'threads': int(status['Threads']), 'fds': len(os.listdir(f'/proc/{pid}/fd'))})
        except (OSError, KeyError, ValueError):  # the process has just exited
            continue
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('path')
    parser.add_argument('--interval', type=float, default=10.0)
    args = parser.parse_args()
    with open(args.path, 'a', buffering=1) as out:
        while True:
            for sample in sample_once():
                out.write(json.dumps(sample) + '\n')
            time.sleep(args.interval)


if __name__ == '__main__':
    main()
