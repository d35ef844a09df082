"""Which GPU: devices named by their index, the current device, several GPUs per machine, resumes
on another GPU. Checked on the CPU with torch's CUDA calls replaced by a stand-in machine of
several GPUs (per-device generators, a current device) that follows torch's semantics."""
from __future__ import annotations

import pytest
import torch

import nmt.train.trainer as trainer_module
import nmt.translate.loading as loading
from nmt.train import distributed
from nmt.train.rng import rng_state, set_rng_state
from nmt.utils import device as device_utils


class StandInGPUs:
    """``count`` CUDA devices: a current one, and a generator state (a byte tensor) per device."""

    def __init__(self, count: int, current: int = 0) -> None:
        self.count, self.current = count, current
        self.states = [torch.full((16,), i, dtype=torch.uint8) for i in range(count)]

    def install(self, monkeypatch) -> "StandInGPUs":
        cuda = torch.cuda
        monkeypatch.setattr(cuda, "is_available", lambda: True)
        monkeypatch.setattr(cuda, "device_count", lambda: self.count)
        monkeypatch.setattr(cuda, "current_device", lambda: self.current)
        monkeypatch.setattr(cuda, "set_device", self.set_device)
        monkeypatch.setattr(cuda, "get_rng_state_all", lambda: [s.clone() for s in self.states])
        monkeypatch.setattr(cuda, "set_rng_state_all", self.set_all)
        monkeypatch.setattr(cuda, "get_rng_state", lambda device="cuda": self.states[self.index(device)].clone())
        monkeypatch.setattr(cuda, "set_rng_state", lambda state, device="cuda": self.set_one(state, device))
        return self

    def index(self, device) -> int:
        index = torch.device(device).index
        return self.current if index is None else index

    def set_device(self, device) -> None:
        if not isinstance(device, int) and torch.device(device).index is None:  # as torch.cuda.set_device
            raise ValueError(f"Expected a torch.device with a specified index or an integer, but got:{device}")
        self.current = device if isinstance(device, int) else self.index(device)

    def set_all(self, states) -> None:
        for i, state in enumerate(states):  # torch: one per device, by index
            self.states[i] = state.clone()

    def set_one(self, state, device) -> None:
        self.states[self.index(device)] = state.clone()


@pytest.fixture
def usable(monkeypatch):
    """Every device name counts as allocatable (no CUDA here): ``usable.refused`` names those
    that are not, and ``usable.probed`` lists the devices checked."""
    class Usable:
        refused: set = set()
        probed: list = []

    def problem(device):
        Usable.probed.append(str(device))
        return "invalid device ordinal" if str(device) in Usable.refused else None

    for module in (loading, trainer_module):
        monkeypatch.setattr(module, "device_problem", problem)
    return Usable


def test_a_cuda_device_is_named_by_its_index(monkeypatch, usable):
    """"auto" and "cuda" resolve to the current GPU by index, once: a bare "cuda" would mean, at
    each later use, the current device of whichever thread uses it (a model loaded on cuda:1 would
    get batches on cuda:0 from a worker thread)."""
    StandInGPUs(2, current=1).install(monkeypatch)
    assert loading.resolve_device("auto") == "cuda:1"
    assert loading.resolve_device("cuda") == "cuda:1"
    assert loading.resolve_device("cuda:0") == "cuda:0"
    assert loading.resolve_device("cpu") == "cpu"
    assert trainer_module.resolve_device("auto") == torch.device("cuda", 1)
    assert trainer_module.resolve_device("cuda") == torch.device("cuda", 1)
    assert trainer_module.resolve_device("cuda:0") == torch.device("cuda", 0)


def test_an_unusable_device_is_a_one_line_error_before_loading(monkeypatch, usable, tmp_path):
    """nmt.load(device="cuda:7") on a machine without it: a one-line ValueError naming the
    device, before the checkpoint is read (the file need not exist); nmt-translate's names its
    option."""
    import nmt

    StandInGPUs(1).install(monkeypatch)
    usable.refused = {"cuda:7"}
    with pytest.raises(ValueError, match=r"^device cuda:7: not a usable device here \(cpu, cuda or cuda:N\); "
                                         r"invalid device ordinal$"):
        nmt.load(tmp_path / "missing.pt", device="cuda:7")
    with pytest.raises(ValueError, match=r"^-device cuda:7: not a usable device here"):
        loading.resolve_device("cuda:7", what="-device")


def test_under_torchrun_no_gpu_is_touched_before_the_ranks_own(monkeypatch, usable):
    """With several processes each trains on its own GPU: the configured device is not probed
    (that would make a CUDA context on it in every process) and an index there is ignored, said so."""
    StandInGPUs(2).install(monkeypatch)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    warned = []
    monkeypatch.setattr(trainer_module.logger, "warning", lambda message, *args: warned.append(message % args))
    assert trainer_module.resolve_device("cuda:1") == torch.device("cuda")
    assert usable.probed == [] and warned == ["training.device cuda:1: under torchrun each process trains on "
                                              "its own GPU"]
    context = distributed.DistributedContext(1, 2, 1, cuda_index=1)
    assert distributed.rank_device(context, torch.device("cuda")) == torch.device("cuda", 1)


def test_a_process_that_sees_only_its_own_gpu_trains_on_it(monkeypatch):
    """Launchers that give each process one GPU (CUDA_VISIBLE_DEVICES naming one device, as SLURM's
    per-task binding does) show every rank that GPU as cuda:0; all GPUs visible, LOCAL_RANK picks;
    a second process on a one-GPU machine stays a one-line error."""
    assert distributed.rank_cuda_index(1, 4, {}) == 1
    assert distributed.rank_cuda_index(3, 1, {"CUDA_VISIBLE_DEVICES": "3"}) == 0
    with pytest.raises(ValueError, match=r"LOCAL_RANK=1 but this machine has 1 CUDA device\(s\)"):
        distributed.rank_cuda_index(1, 1, {})
    with pytest.raises(ValueError, match=r"LOCAL_RANK=2 but this machine has 2 CUDA device\(s\)"):
        distributed.rank_cuda_index(2, 2, {"CUDA_VISIBLE_DEVICES": "0,1"})
    context = distributed.DistributedContext(3, 4, 3, cuda_index=0)
    assert distributed.rank_device(context, torch.device("cuda")) == torch.device("cuda", 0)


@pytest.mark.parametrize("saved_on, gpus_then, resumed_on, gpus_now", [
    (1, 2, 0, 1),  # a 2-GPU machine's cuda:1 -> a 1-GPU machine
    (1, 2, 0, 2),  # cuda:1 -> cuda:0 on the same machine
    (0, 1, 1, 2),  # cuda:0 -> cuda:1
    (1, 2, 1, 2),  # the same GPU
])
def test_a_resume_on_another_gpu_continues_its_random_stream(monkeypatch, saved_on, gpus_then, resumed_on, gpus_now):
    """The training GPU's generator after a resume is the one saved from the training GPU, whatever
    the two indices: dropout continues instead of replaying the run's first random numbers. (By
    index alone, a resume on another GPU kept the seed's state.) The other GPUs restore by index."""
    then = StandInGPUs(gpus_then).install(monkeypatch)
    then.states[saved_on] = torch.full((16,), 200, dtype=torch.uint8)  # the trained GPU's stream, advanced
    state = rng_state(torch.device("cuda", saved_on))
    now = StandInGPUs(gpus_now).install(monkeypatch)
    set_rng_state(state, torch.device("cuda", resumed_on))
    assert torch.equal(now.states[resumed_on], torch.full((16,), 200, dtype=torch.uint8))
    by_index = [i for i in range(min(gpus_then, gpus_now)) if i != resumed_on]
    assert all(torch.equal(now.states[i], then.states[i]) for i in by_index)


def test_checkpoints_without_the_training_gpus_state_restore_by_index(monkeypatch):
    """Checkpoints written before the training GPU's own state was saved (or on the CPU) restore
    the CUDA generators by index, as they did."""
    then = StandInGPUs(2).install(monkeypatch)
    then.states[1] = torch.full((16,), 99, dtype=torch.uint8)
    state = rng_state()  # no device: no training GPU's state
    assert "cuda_device" not in state
    now = StandInGPUs(2).install(monkeypatch)
    set_rng_state(state, torch.device("cuda", 0))
    assert torch.equal(now.states[1], torch.full((16,), 99, dtype=torch.uint8))
    assert torch.equal(now.states[0], then.states[0])


def test_make_current_sets_a_cuda_device_only(monkeypatch):
    """The programs' one device becomes current where it is a GPU; the CPU changes nothing."""
    gpus = StandInGPUs(2).install(monkeypatch)
    device_utils.make_current("cpu")
    assert gpus.current == 0
    device_utils.make_current("cuda:1")
    assert gpus.current == 1
    device_utils.make_current("cuda")  # the benchmarks' --device cuda: the current device, kept
    device_utils.make_current(torch.device("cuda"))
    assert gpus.current == 1


def test_a_cuda_index_past_the_machines_gpus_names_how_many_there_are(monkeypatch, tmp_path):
    """``cuda:1`` on a one-GPU machine: the count of GPUs, from the device count, before any
    allocation (CUDA's own answer is "invalid device ordinal" with advice on further lines); the
    same in nmt.load (before the file is read), nmt-translate's -device and training.device."""
    import nmt

    StandInGPUs(1).install(monkeypatch)
    with pytest.raises(ValueError) as info:
        nmt.load(tmp_path / "missing.pt", device="cuda:1")
    assert str(info.value) == ("device cuda:1: not a usable device here (cpu, cuda or cuda:N); "
                               "this machine has 1 CUDA device (cuda:0)")
    with pytest.raises(ValueError, match=r"^-device cuda:2: .*; this machine has 1 CUDA device \(cuda:0\)$"):
        loading.resolve_device("cuda:2", what="-device")
    StandInGPUs(2).install(monkeypatch)
    with pytest.raises(ValueError) as info:
        trainer_module.resolve_device("cuda:3")
    assert str(info.value) == "'cuda:3' is not usable here (this machine has 2 CUDA devices (cuda:0 to cuda:1))"


def test_an_unavailable_backend_is_said_in_one_sentence(monkeypatch):
    """A device type torch knows but this machine lacks (mps off a Mac, xpu) is named as missing;
    any other allocation error is cut to its first sentence (torch's dispatcher errors go on for a
    paragraph, and were cut mid-word)."""
    monkeypatch.setattr(torch.mps, "is_available", lambda: False)
    assert device_utils.device_problem("mps") == "no mps device is available on this machine"
    with pytest.raises(ValueError) as info:
        loading.resolve_device("mps", what="-device")
    assert str(info.value) == ("-device mps: not a usable device here (cpu, cuda or cuda:N); "
                               "no mps device is available on this machine")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert device_utils.device_problem("cuda:0") == "CUDA is not available on this machine"
    long = "Could not run 'aten::empty.memory_format' with arguments from the 'X' backend. " + "More. " * 40

    def refuse(*args, **kwargs):
        raise NotImplementedError(long + "\nsecond line")

    monkeypatch.setattr(torch, "empty", refuse)
    assert device_utils.device_problem("cpu") == "Could not run 'aten::empty.memory_format' with arguments " \
                                                 "from the 'X' backend."


@pytest.mark.parametrize("device, expected", [
    ("cuda:1", "{what} device cuda:1: CUDA is not available on this machine"),
    ("auto", "{what} device auto: name the model's device (cpu, cuda, cuda:N); auto is resolved when loading "
             "(nmt.load, -device)"),
    ("gpu", "{what} device gpu: not a device name; valid: cpu, cuda, cuda:N"),
])
def test_translator_and_scorer_refuse_a_device_at_construction(monkeypatch, device, expected):
    """The classes behind nmt.load take the model's device as given: one they cannot use is a
    one-line ValueError naming it when they are made (it failed at the first batch, deep in torch:
    "Cannot access accelerator device when none is available")."""
    from nmt.translate import Scorer, Translator

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for cls in (Translator, Scorer):
        with pytest.raises(ValueError) as info:
            cls(None, None, None, device=device)
        assert str(info.value) == expected.format(what=cls.__name__)
    assert Translator(None, None, None, device=torch.device("cpu")).device == torch.device("cpu")
