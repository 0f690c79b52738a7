"""training.plan: the run plan counts what accelerate's prepared loader gives, and budgets become steps once."""

import pytest
from accelerate.data_loader import prepare_data_loader

from core.errors import InputError
from training.config import TrainingConfig
from training.data import LengthGroupedSampler, make_train_dataloader
from training.plan import make_plan


@pytest.mark.parametrize("grouped", [False, True])
def test_the_plan_counts_the_batches_accelerate_gives_each_process(grouped, tmp_path):
    config = TrainingConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_train_epochs=2.0)
    for n in (1, 3, 7, 33, 65):
        sampler = LengthGroupedSampler([1 + i % 5 for i in range(n)], 4, 0) if grouped else None
        loader = make_train_dataloader(list(range(n)), 4, lambda x: x, 0, sampler=sampler)
        for processes in (1, 2, 3):
            plan = make_plan(config, train_examples=n, num_processes=processes)
            for index in range(processes):
                prepared = prepare_data_loader(loader, num_processes=processes, process_index=index)
                assert plan.batches_per_process == len(prepared), (n, processes, index)
            assert plan.max_train_steps == 2 * len(prepared)  # --num_train_epochs 2


def test_steps_warmup_intervals_and_budgets(tmp_path):
    config = TrainingConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=8,
        gradient_accumulation_steps=2,
        warmup_ratio=0.06,
        eval_steps=0.1,
        checkpointing_steps=25,
    )
    plan = make_plan(config, train_examples=1000, num_processes=2, max_seq_length=128)
    # 1000 examples / 8 = 125 batches, 63 per process, 32 optimizer steps (31 x 2 + 1) per epoch
    assert (plan.batches_per_process, plan.steps_per_epoch, plan.max_train_steps) == (63, 32, 32)
    assert (plan.num_warmup_steps, plan.eval_steps, plan.checkpointing_steps) == (2, 4, 25)  # ceil(1.92), ceil(3.2)
    assert plan.global_batch_size == 32 and plan.tokens_per_step == 32 * 128 and plan.evaluations == 9
    by_tokens = make_plan(config, train_examples=1000, num_processes=2, max_seq_length=128, max_train_tokens=40_961)
    assert by_tokens.max_train_steps == 11 and by_tokens.eval_steps == 2  # ceil(40961 / 4096), ceil(1.1)
    by_time = make_plan(config, train_examples=None, num_processes=1, max_train_steps=7, seconds_per_step=0.5)
    assert by_time.max_train_steps == 7 and by_time.steps_per_epoch is None and by_time.epochs is None
    assert by_time.settings() == {
        "max_train_steps": 7,
        "time_budget_seconds_per_step": 0.5,
        "num_warmup_steps": 1,
        "eval_steps": 1,
        "checkpointing_steps": 25,
    }
    with pytest.raises(InputError, match="--max_train_steps"):
        make_plan(config, train_examples=None, num_processes=1)  # a stream without steps
