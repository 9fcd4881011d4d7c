"""A throwaway adapter for attn-diff's own tests: the numpy reference with one planted fault.

    misbehaving.py MODE [MARKER]

MODE:
  window-off-by-one   decoder windows see one key too many (a wrong answer to shrink);
  crash-on-batches    exits with status 3 on any case of more than one sequence;
  hang-on-batches     never answers a case of more than one sequence;
  wrong-shape-on-batches  answers a batch with one output row too few;
  print-on-batches    writes text to stdout before the reply to a batch;
  wrong-then-hang     answers its first case wrong, then never answers again (a divergence
                      whose shrinking hangs: what an interrupt must survive);
  hang-every-second   answers its first forward call, hangs on its second, and so on: every
                      restart answers once, so a timeout's shrink alternates answers and hangs.
MARKER is ignored: tests find the process (and its children) by it.
"""

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "adapters", "python"))

import attn_diff_adapter  # noqa: E402
from numpy_reference import NumpyReference  # noqa: E402

MODE = sys.argv[1]


class Misbehaving(NumpyReference):
    name = f"misbehaving-{MODE}"

    def visible(self, config, rel):
        mask = super().visible(config, rel)
        if MODE == "window-off-by-one" and config.sliding_window and config.kind == "decoder":
            mask |= (rel <= 0) & (rel == -config.sliding_window)
        return mask

    answered_wrong = False
    forward_calls = 0

    def forward(self, config, cache, step):
        batch = len(step.seq_lens) > 1
        Misbehaving.forward_calls += 1
        if MODE == "hang-every-second" and Misbehaving.forward_calls % 2 == 0:
            time.sleep(3600)
        if MODE == "wrong-then-hang":
            if Misbehaving.answered_wrong:
                time.sleep(3600)
            Misbehaving.answered_wrong = True
            return super().forward(config, cache, step) * 2.0 + 1.0
        if batch and MODE == "crash-on-batches":
            sys.stderr.write(f"planted crash on a batch of {len(step.seq_lens)}\n")
            sys.stderr.flush()
            os._exit(3)
        if batch and MODE == "hang-on-batches":
            time.sleep(3600)
        out = super().forward(config, cache, step)
        if batch and MODE == "wrong-shape-on-batches":
            return out[1:]
        if batch and MODE == "print-on-batches":
            Chatty.armed = True
        return out


class Chatty:
    """Wraps the frame writer to put text on the protocol stream once when armed."""

    armed = False
    write_frame = attn_diff_adapter.write_frame

    @staticmethod
    def write(stream, payload):
        if Chatty.armed:
            Chatty.armed = False
            stream.write(b"result: ok\n")
        Chatty.write_frame(stream, payload)


attn_diff_adapter.write_frame = Chatty.write

if __name__ == "__main__":
    attn_diff_adapter.serve(Misbehaving())
