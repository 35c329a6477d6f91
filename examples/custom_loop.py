"""A training loop written by hand, without the Learner: the whole of it is these few lines.

    python examples/custom_loop.py            # MLP on the real MNIST digits, ~1 minute

Gradients come back from backward() as a value (never stored on the parameters), and the
optimizer returns the updated model, as in Burn.
"""

import time

import cinders as cn
from cinders.data import DataLoader
from cinders.data.augment import RandomDistortion
from cinders.data.mnist import MnistBatcher, MnistDigits
from cinders.models.mnist import MnistMLP
from cinders.nn import functional as F


def main(epochs=5):
    backend = cn.Autodiff(cn.NumPy())  # records the tape, so loss.backward() works
    cn.manual_seed(0)
    model = MnistMLP().to(backend)
    optimizer = cn.optim.Adam(lr=1e-3)
    train = DataLoader(MnistDigits("train"), batch_size=64, shuffle=True, seed=0,
                       batcher=MnistBatcher(backend, augment=RandomDistortion()))
    heldout = DataLoader(MnistDigits("heldout"), batch_size=500, batcher=MnistBatcher(backend))

    for epoch in range(epochs):
        t0, total_loss = time.time(), 0.0
        model.train()
        for images, labels in train:
            loss = F.cross_entropy(model(images), labels)
            grads = loss.backward()                 # a cn.Gradients
            model = optimizer.step(model, grads)    # new parameters, same model object
            total_loss += loss.item()

        model.eval()
        right = 0
        with cn.no_grad():                          # no tape while evaluating
            for images, labels in heldout:
                right += (model(images).argmax(axis=-1) == labels).sum().item()
        print("epoch %d  loss %.4f  held-out accuracy %.4f  (%.1f s)"
              % (epoch + 1, total_loss / len(train), right / len(heldout.dataset), time.time() - t0))

    model.save("mnist-mlp-custom.safetensors")
    print("saved mnist-mlp-custom.safetensors")


if __name__ == "__main__":
    main()
