"""The models of the QoS benchmark, built from configs with fixed-seed random weights (nothing downloads).

ResNet-50 comes from torchvision where it is installed, else from transformers' ResNet config (the same
architecture); BERT-base from transformers. Every builder seeds first, so two processes build the same
weights and the production outputs of two runs can be compared bit for bit.
"""
import torch


def deterministic():
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def resnet50(num_classes=1000):
    torch.manual_seed(0)
    try:
        import torchvision

        return torchvision.models.resnet50(num_classes=num_classes), "torchvision"
    except ImportError:
        from transformers import ResNetConfig, ResNetForImageClassification

        cfg = ResNetConfig(num_labels=num_classes)  # the default config is ResNet-50
        m = ResNetForImageClassification(cfg)

        class Logits(torch.nn.Module):
            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def forward(self, x):
                return self.inner(pixel_values=x).logits

        return Logits(m), "transformers"


def bert_base():
    torch.manual_seed(0)
    from transformers import BertConfig, BertModel

    m = BertModel(BertConfig())  # bert-base: 12 layers, hidden 768

    class Pooled(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, ids):
            return self.inner(input_ids=ids).last_hidden_state

    return Pooled(m)


def inference_model(name, batch):
    """The model in eval mode, fp16, on the GPU, and a fixed input batch."""
    g = torch.Generator().manual_seed(1)
    if name in ("resnet50", "resnet50-eager"):
        m, _ = resnet50()
        x = torch.randn(batch, 3, 224, 224, generator=g)
    elif name == "bert":
        m = bert_base()
        x = torch.randint(0, 30000, (batch, 128), generator=g)
    else:
        raise ValueError(name)
    m = m.eval().half().cuda()
    x = x.cuda()
    if x.is_floating_point():
        x = x.half()
    return m, x
