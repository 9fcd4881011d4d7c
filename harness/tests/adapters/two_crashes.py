"""Two distinct crashes, as a backend in development has them: the numpy reference adapter
that writes a padding token's slot -1 through `index_copy_`-style indexing (IndexError) and
builds a mask tile of 64 for blocks of 64 or more (a shape error). Both reach attn-diff as
Python tracebacks whose first line is the same; each must be its own class, named by what
was raised.

    python3 two_crashes.py ADAPTERS_DIR
"""

import sys

sys.path.insert(0, sys.argv[1])
from attn_diff_adapter import serve  # noqa: E402
from numpy_reference import NumpyReference  # noqa: E402


def _write_slot(slot, slots):
    if slot < 0:
        raise IndexError(f"index_copy_(): index {slot} is out of bounds for dimension 0 with size {slots}")


def _mask_tile(block_size):
    if block_size >= 64:
        raise RuntimeError(
            f"The size of tensor a ({block_size + 128}) must match the size of tensor b (64) "
            "at non-singleton dimension 3"
        )


class TwoCrashes(NumpyReference):
    name = "two-crashes"
    description = "numpy reference with two planted crashes"

    def write_kv(self, config, cache, key, value, slot_mapping):
        for s in slot_mapping:
            _write_slot(int(s), 1 << 20)
        return super().write_kv(config, cache, key, value, slot_mapping)

    def forward(self, config, cache, step):
        _mask_tile(config.block_size)
        return super().forward(config, cache, step)


if __name__ == "__main__":
    serve(TwoCrashes())
