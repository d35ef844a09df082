"""The sync audit counts every host-synchronising call it names, and nothing else."""
import torch

from nmt.utils.sync_audit import SyncAudit, count_host_syncs


def test_counts_each_synchronising_call():
    x = torch.randn(4, 5, requires_grad=True)
    with SyncAudit() as audit:
        x.sum().item()
        x.tolist()
        bool(x[0, 0] > 0)
        torch.nonzero(x > 0)
        (x > 0).nonzero()
        x[x > 0]
        torch.where(x > 0)
        x.masked_select(x > 0)
        torch.unique(x)
        int(x[0, 0])
    assert audit.counts == {
        "Tensor.item": 1, "Tensor.tolist": 1, "Tensor.__bool__": 1, "torch.nonzero": 1, "Tensor.nonzero": 1,
        "Tensor[bool mask]": 1, "torch.where(cond)": 1, "Tensor.masked_select": 1, "torch.unique": 1,
        "Tensor.__int__": 1,
    }, audit.report()
    assert audit.total == 10


def test_static_code_counts_zero_and_wrappers_are_removed():
    x = torch.randn(4, 5, requires_grad=True)

    def static(x):
        y = torch.where(x > 0, x, torch.zeros_like(x)) + x[:, :2].sum(-1, keepdim=True) + x[torch.tensor([0, 1])].sum()
        y.sum().backward()
        return y

    _, audit = count_host_syncs(static, x)
    assert audit.total == 0, audit.report()
    assert torch.Tensor.item is torch._C.TensorBase.item or not hasattr(torch.Tensor.item, "__wrapped__")
    with SyncAudit() as outer:
        pass
    x.sum().item()  # outside any audit: not counted anywhere
    assert outer.total == 0


def test_counts_inside_custom_backward():
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            g.sum().item()
            return g * 2

    x = torch.randn(3, requires_grad=True)
    with SyncAudit() as audit:
        F.apply(x).sum().backward()
    assert audit.counts["Tensor.item"] == 1


def test_counts_comparisons_read_back_to_python():
    """``torch.equal`` / ``allclose`` return a Python bool and ``bincount`` sizes its output from
    the data: each waits for an accelerator."""
    x, y = torch.randn(3), torch.randn(3)
    with SyncAudit() as audit:
        torch.equal(x, y)
        x.equal(y)
        torch.allclose(x, y)
        torch.bincount(torch.tensor([0, 2]))
    assert audit.counts == {"torch.equal": 1, "Tensor.equal": 1, "torch.allclose": 1, "torch.bincount": 1}, \
        audit.report()


def test_sync_sites_name_the_calling_lines():
    """host_sync_sites_on: each kind of synchronising call with the line that first made it; the
    counts sum to count_host_syncs_on's."""
    import inspect

    from nmt.utils.host_syncs import count_host_syncs_on, host_sync_sites_on

    x = torch.randn(3)

    def work():
        a = x.sum().item()
        b = x.sum().item()
        return a + b + len(x.tolist())

    first = inspect.getsourcelines(work)[1] + 1  # the line of the first .item()
    result, sites = host_sync_sites_on("cpu", work)
    assert result == work()
    assert sites == {f"{__file__}:{first} (Tensor.item)": 2, f"{__file__}:{first + 2} (Tensor.tolist)": 1}
    assert count_host_syncs_on("cpu", work)[1] == 3
