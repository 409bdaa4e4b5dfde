"""
Plot the samples of ``python -m tools.soak.sampler``: RSS and open file descriptors of each incarnation of the
soak's operator over the run (a new colour per incarnation: SIGKILLs, SIGTERMs and SIGINTs restart it).

Usage: ``python -m tools.soak.plot SAMPLES.jsonl OUT.png [--title TEXT]``; prints a summary per incarnation.
"""
import argparse
import collections
import json


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('samples')
    parser.add_argument('out')
    parser.add_argument('--title', default='The soak: the operator over time')
    args = parser.parse_args()

    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    by_pid: dict[int, list[dict[str, float]]] = collections.defaultdict(list)
    with open(args.samples) as f:
        for line in f:
            sample = json.loads(line)
            by_pid[sample['pid']].append(sample)
    start = min(s['time'] for samples in by_pid.values() for s in samples)
    figure, (rss_axes, fds_axes) = plt.subplots(2, 1, sharex=True, figsize=(10, 6))
    for pid, samples in sorted(by_pid.items(), key=lambda item: item[1][0]['time']):
        minutes = [(s['time'] - start) / 60 for s in samples]
        rss_axes.plot(minutes, [s['rss_kb'] / 1024 for s in samples], linewidth=1)
        fds_axes.plot(minutes, [s['fds'] for s in samples], linewidth=1)
        rss = [s['rss_kb'] for s in samples]
        print(f'pid {pid}: {len(samples)} samples over {minutes[-1] - minutes[0]:.1f} min '
              f'from {minutes[0]:.1f}; '
              f'RSS {rss[0]}..{max(rss)} kB (last {rss[-1]}); '
              f'fds {min(s["fds"] for s in samples)}..{max(s["fds"] for s in samples)}; '
              f'threads {min(s["threads"] for s in samples)}..{max(s["threads"] for s in samples)}')
    rss_axes.set_ylabel('RSS, MB')
    fds_axes.set_ylabel('open fds')
    fds_axes.set_xlabel('minutes since the start (a colour per incarnation of the operator)')
    rss_axes.set_title(args.title)
    rss_axes.grid(alpha=0.3)
    fds_axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(args.out, dpi=100)


if __name__ == '__main__':
    main()
