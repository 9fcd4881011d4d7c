"""A narrow backend as one in development is: the numpy reference adapter declaring what
vllm-spyre's branch-head backend accepts (fp16, head sizes in multiples of 64, one sequence
per step, decoder only, no optional feature), and asserting it as upstream's `forward` does,
so a case sent outside the declared space is an error rather than a silent pass.

    python3 narrow.py ADAPTERS_DIR
"""

import sys

sys.path.insert(0, sys.argv[1])
from attn_diff_adapter import serve  # noqa: E402
from numpy_reference import NumpyReference  # noqa: E402


class Narrow(NumpyReference):
    name = "narrow"
    description = "numpy reference declaring a narrow space and asserting it"
    capabilities = {
        "dtypes": ["f16"],
        "head_size_multiple_of": 64,
        "max_seqs": 1,
        "kinds": ["decoder"],
        "features": [],
    }

    def forward(self, config, cache, step):
        assert len(step.seq_lens) == 1, f"{len(step.seq_lens)} sequences in one step"
        assert config.dtype == "f16", config.dtype
        assert config.head_size % 64 == 0, config.head_size
        assert config.kind == "decoder", config.kind
        assert config.sliding_window is None and config.logits_soft_cap is None
        assert config.alibi_slopes is None and config.sinks is None
        return super().forward(config, cache, step)


if __name__ == "__main__":
    serve(Narrow())
