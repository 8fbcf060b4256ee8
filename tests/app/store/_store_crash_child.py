"""Helper process for the store's kill -9 tests (not a test module).

    python _store_crash_child.py DATA_DIR SEED write   # writes chats until killed
    python _store_crash_child.py DATA_DIR SEED hold    # opens the store and waits

It prints one line per durable event, flushed right after the store call returned:
    ready PID
    user MESSAGE_ID SHA256_OF_TEXT
    begin MESSAGE_ID
    ckpt MESSAGE_ID CHARS        (the checkpoint of the first CHARS of reply_text(id))
    done MESSAGE_ID
The full reply of message id N is always reply_text(N), so the parent can check texts.
"""
from __future__ import annotations

import hashlib
import os
import random
import sys
import time

from tramontane.app.store import Store
from tramontane.engine.api import GenerationStats, ImagePart

_WORDS = "le vent tramontane souffle fort sur la côte 北風 ∑ naïve café \n - * ok".split(" ")


def reply_text(message_id: int) -> str:
    """The deterministic full text of reply `message_id`."""
    rng = random.Random(message_id * 7919)
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(20, 200)))


def say(*fields: object) -> None:
    print(*fields, flush=True)


def write_forever(store: Store, seed: int) -> None:
    rng = random.Random(seed)
    chats = [c.id for c in store.list_chats()]
    while True:
        if not chats or rng.random() < 0.3:
            chats.append(store.create_chat(f"crash chat {seed}-{len(chats)}"))
        chat_id = rng.choice(chats)
        question = f"question {seed} {rng.random()} Ünïcode"
        images = []
        if rng.random() < 0.3:  # a small fake PNG, sometimes the same one again
            body = bytes(rng.randrange(4) for _ in range(rng.randint(16, 4000)))
            images.append(ImagePart(b"\x89PNG\r\n\x1a\n" + body, "pic.png"))
        user_id = store.add_message(chat_id, "user", question, images)
        say("user", user_id, hashlib.sha256(question.encode()).hexdigest())

        reply_id = store.begin_reply(chat_id)
        say("begin", reply_id)
        full = reply_text(reply_id)
        pos = 0
        while pos < len(full):
            pos = min(len(full), pos + rng.randint(1, 60))
            if store.checkpoint_reply(reply_id, full[:pos]):
                say("ckpt", reply_id, pos)
            time.sleep(rng.random() * 0.004)
        stats = GenerationStats(prompt_tokens=len(question), generated_tokens=len(full) // 4,
                                ttft_s=0.05, decode_tok_s=42.0, finish_reason="stop")
        store.finish_reply(reply_id, full, stats)
        say("done", reply_id)


def main() -> None:
    data_dir, seed, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    store = Store(data_dir, checkpoint_interval_s=0.0)
    say("ready", os.getpid())
    if mode == "hold":
        while True:
            time.sleep(60)
    write_forever(store, seed)


if __name__ == "__main__":
    main()
