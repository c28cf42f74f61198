#!/usr/bin/env python3
"""Regenerates spot_interruptions.csv from the preemption traces of skypilot-org/spot-traces
(copied in the project's shared data: spot-traces/preemption/). See ../README.md.

    python3 gen_spot_interruptions.py /work/shared/data/spot-traces/preemption > spot_interruptions.csv

Reading: each value is how many launched spot instances were alive at that tick; a drop from
one tick to the next is that many interruptions; instance-hours are the sum of values x gap.
"""
import glob
import json
import os
import sys


def main(root):
    print("cloud,region,zone,traced,instance_hours,interruptions,trace")
    for path in sorted(glob.glob(os.path.join(root, "*", "*", "*.json"))):
        rel = os.path.relpath(path, root)
        with open(path) as f:
            d = json.load(f)
        gap, v = d["metadata"]["gap_seconds"], d["data"]
        held = sum(v) * gap / 3600
        drops = sum(max(0, v[i - 1] - v[i]) for i in range(1, len(v)))
        zone, traced = os.path.basename(path)[:-5].split("_", 1)
        cloud = "gcp" if rel.split(os.sep)[1].startswith("gcp") else "aws"
        region = zone.rsplit("-", 1)[0] if cloud == "gcp" else zone.rstrip("abcdefghijklmnopqrstuvwxyz")
        print("%s,%s,%s,%s,%.2f,%d,preemption/%s" % (cloud, region, zone, traced, held, drops, rel))


if __name__ == "__main__":
    main(sys.argv[1])
