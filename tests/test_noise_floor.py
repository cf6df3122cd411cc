"""The noise floor's rerun of the reference submits its items in another order (other batch neighbours) and with
another sampling seed; the first run keeps the run's order."""
from __future__ import annotations

from evalkit.worker import replicate_order  # first: it imports the suite registry, which suites.base needs
from evalkit.suites.base import Item


def test_the_rerun_shuffles_its_items_reproducibly_and_the_first_run_does_not() -> None:
    items = [Item(f"q{i:03d}", "all") for i in range(48)]
    assert replicate_order(items, 0, "mmlu") == items
    rerun = replicate_order(items, 1, "mmlu")
    assert sorted(i.item_id for i in rerun) == [i.item_id for i in items]  # the same items, each once
    assert rerun != items and rerun == replicate_order(items, 1, "mmlu")  # another order, the same every time
    # Batches of 16 (the default config's max_num_seqs) hold other neighbours in the rerun.
    batches = lambda xs: {frozenset(i.item_id for i in xs[k:k + 16]) for k in range(0, len(xs), 16)}  # noqa: E731
    assert batches(rerun) != batches(items)
    assert replicate_order(items, 1, "prompts") != rerun  # each suite its own order
