#!/usr/bin/env python3
"""Regenerates aws_cpu.csv: AWS general-purpose (m), compute (c) and memory (r) instance types
of the current x86 generations, with on-demand Linux prices from Karpenter's generated price
table. See ../README.md ("AWS CPU instances") for the sources and what is missing.

    cd /tmp && go mod download -json github.com/aws/karpenter-provider-aws@v1.15.1
    (go may refuse to *build* it with an older toolchain; the zip is still downloaded:)
    unzip -o ~/go/pkg/mod/cache/download/github.com/aws/karpenter-provider-aws/@v/v1.15.1.zip \
        'github.com/aws/karpenter-provider-aws@v1.15.1/pkg/providers/pricing/zz_generated.pricing_aws.go'
    python3 gen_aws_cpu.py github.com/aws/karpenter-provider-aws@v1.15.1/pkg/providers/pricing/zz_generated.pricing_aws.go > aws_cpu.csv
"""
import re
import sys

FAMILIES = ["c6i", "c7i", "m6i", "m7i", "r6i", "r7i"]
# GiB of memory per vCPU, as AWS's instance type pages state for these families
# (https://aws.amazon.com/ec2/instance-types/): compute 2, general purpose 4, memory 8.
GIB_PER_VCPU = {"c": 2, "m": 4, "r": 8}


def vcpus(size):
    """vCPUs of a size name: large 2, xlarge 4, Nxlarge 4N (AWS's naming for these families)."""
    if size == "large":
        return 2
    if size == "xlarge":
        return 4
    m = re.fullmatch(r"(\d+)xlarge", size)
    return 4 * int(m.group(1)) if m else None  # metal sizes are skipped


def main(path):
    text = open(path).read()
    regions = re.findall(r'^\t"([a-z0-9-]+)": \{', text, re.M)
    print("instance_type,accelerator,accelerator_count,vcpus,memory_gib,gpu_memory_mib,"
          "ondemand_usd_per_hour,spot_usd_per_hour,region,zone")
    blocks = re.split(r'^\t"([a-z0-9-]+)": \{', text, flags=re.M)[1:]
    rows = []
    for region, body in zip(blocks[0::2], blocks[1::2]):
        for name, price in re.findall(r'"([a-z0-9-]+\.[a-z0-9-]+)": ([0-9.]+)', body):
            family, size = name.split(".", 1)
            n = vcpus(size)
            if family not in FAMILIES or n is None:
                continue
            mem = n * GIB_PER_VCPU[family[0]]
            rows.append((name, n, mem, float(price), region))
    if not rows:
        sys.exit("no rows: is %s Karpenter's pricing table? (regions seen: %s)" % (path, regions))
    for name, n, mem, price, region in sorted(rows):
        # Zone left empty: on-demand prices are per region, and EC2 picks the zone.
        print("%s,,0,%d,%d,0,%s,,%s," % (name, n, mem, ("%.6f" % price).rstrip("0").rstrip("."), region))


if __name__ == "__main__":
    main(sys.argv[1])
