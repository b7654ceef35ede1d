import torch

import trainplan as tp


def train() -> dict[str, tp.PlainValue]:
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    with tp.runtime() as rt:  # this job's plan, joined: ranks, device, process group, precision
        model = rt.wrap(torch.nn.Linear(8, 1))  # placed, cast or wrapped as the strategy says (DDP here)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = torch.utils.data.DataLoader(data, batch_size=8, sampler=rt.sampler(data))
        store = rt.metric_store()
        for inputs, targets in loader:
            x, y = inputs.to(rt.device), targets.to(rt.device)
            with rt.autocast():  # the plan's autocast: bfloat16 for bf16-mixed, nothing for *-true
                loss = torch.nn.functional.mse_loss(model(x).float(), y)
            rt.step(loss, optimizer)  # backward (scaled where fp16 AMP needs it), step, zero_grad
            store.log("loss", loss.detach(), weight=len(x))
            store.log("target_mean", y.mean().item(), weight=len(x))
            store.log("samples", len(x), reduce="sum")
        return store.compute()  # synced over every rank


if __name__ == "__main__":
    print(train())
