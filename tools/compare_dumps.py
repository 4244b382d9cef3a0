"""Compares two mha-dump outputs element-wise within mha.h's ISA tolerance,
|a - r| <= 1e-5 + 1e-5 |r| (r: the reference file). Usage: compare_dumps.py REF OTHER"""
import sys
from array import array

ref, other = (array("f", open(path, "rb").read()) for path in sys.argv[1:3])
if len(ref) != len(other) or not ref:
    sys.exit(f"compare_dumps: sizes differ or empty ({len(ref)} vs {len(other)} floats)")
worst = max(abs(a - r) / (1e-5 + 1e-5 * abs(r)) for a, r in zip(other, ref))
print(f"{len(ref)} floats, worst error {worst:.3f} x tolerance")
sys.exit(0 if worst <= 1.0 else 1)
