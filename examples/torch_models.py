"""ringgrad's models written in plain PyTorch, with ringgrad's module names, so that state_dicts
move between the two unchanged: ToyNet (layers/models/toynet.cpp, PyTorch's examples/mnist
network), ResNet-18 with the CIFAR stem (layers/models/resnet.cpp) and minGPT's GPT
(layers/models/gpt.cpp). Used by check_resnet18_in_pytorch.py, check_gpt_in_pytorch.py and the
benchmarks against PyTorch (bench/pytorch/train_bench.py, gpt_bench.py). Needs only torch."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class ToyNet(nn.Module):
    """PyTorch's MNIST example network, as layers/models/toynet.cpp."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3)
        self.conv2 = nn.Conv2d(32, 64, 3)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = torch.flatten(self.dropout1(x), 1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return self.fc2(x)


class BasicBlock(nn.Module):
    def __init__(self, in_planes, planes, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or in_planes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(in_planes, planes, 1, stride, bias=False),
                                            nn.BatchNorm2d(planes))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = self.downsample(x) if self.downsample is not None else x
        return F.relu(out + identity)


class ResNet18(nn.Module):
    """torchvision's ResNet-18 with the CIFAR stem (3x3 conv, no max pool), as
    layers/models/resnet.cpp."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        layers, in_planes = [], 64
        for i, planes in enumerate([64, 128, 256, 512]):
            stride = 1 if i == 0 else 2
            layers.append(nn.Sequential(BasicBlock(in_planes, planes, stride),
                                        BasicBlock(planes, planes, 1)))
            in_planes = planes
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


# minGPT (Karpathy's mingpt/model.py), written out again with its structure and names, as
# layers/models/gpt.cpp: (n_layer, n_head, n_embd) of its named sizes.
GPT_CONFIGS = {"gpt-nano": (3, 3, 48), "gpt-micro": (4, 4, 128), "gpt-mini": (6, 6, 192)}


class NewGELU(nn.Module):
    """GELU's tanh approximation (Google BERT's and OpenAI GPT's)."""

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3.0))))


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with an explicit masked softmax. The causal mask is a
    non-persistent buffer: minGPT's own `attn.bias` is persistent (it appears in minGPT's
    state_dict), ringgrad's model has no such tensor, so with persistent=False a strict
    load_state_dict matches ringgrad's state_dict name for name."""

    def __init__(self, n_embd, n_head, block_size, attn_pdrop, resid_pdrop):
        super().__init__()
        assert n_embd % n_head == 0
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.attn_dropout = nn.Dropout(attn_pdrop)
        self.resid_dropout = nn.Dropout(resid_pdrop)
        mask = torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size)
        self.register_buffer("bias", mask, persistent=False)
        self.n_head, self.n_embd = n_head, n_embd

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # [B, H, T, Dh]
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = self.attn_dropout(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)  # heads side by side again
        return self.resid_dropout(self.c_proj(y))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, block_size, attn_pdrop, resid_pdrop):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size, attn_pdrop, resid_pdrop)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.ModuleDict(dict(c_fc=nn.Linear(n_embd, 4 * n_embd),
                                      c_proj=nn.Linear(4 * n_embd, n_embd),
                                      act=NewGELU(), dropout=nn.Dropout(resid_pdrop)))

    def forward(self, x):
        m = self.mlp
        x = x + self.attn(self.ln_1(x))
        return x + m.dropout(m.c_proj(m.act(m.c_fc(self.ln_2(x)))))


class GPT(nn.Module):
    """minGPT's GPT: model_type one of GPT_CONFIGS; dropout 0.1 (embeddings, residuals and the
    attention probabilities, the last on the materialised `att` as minGPT's) as minGPT's default.
    tie_weights: lm_head.weight is transformer.wte.weight (both names in the state_dict)."""

    def __init__(self, model_type, vocab_size, block_size, embd_pdrop=0.1, resid_pdrop=0.1,
                 attn_pdrop=0.1, tie_weights=False):
        super().__init__()
        n_layer, n_head, n_embd = GPT_CONFIGS[model_type]
        self.block_size = block_size
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd),
            wpe=nn.Embedding(block_size, n_embd),
            drop=nn.Dropout(embd_pdrop),
            h=nn.ModuleList([Block(n_embd, n_head, block_size, attn_pdrop, resid_pdrop)
                             for _ in range(n_layer)]),
            ln_f=nn.LayerNorm(n_embd)))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        if tie_weights:
            self.lm_head.weight = self.transformer.wte.weight
        # minGPT's init, then the scaled init of the residual projections (GPT-2's).
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
        elif isinstance(module, nn.LayerNorm):
            torch.nn.init.zeros_(module.bias)
            torch.nn.init.ones_(module.weight)

    def configure_optimizers(self, learning_rate, weight_decay, betas=(0.9, 0.95)):
        """minGPT's AdamW: weight decay for the Linear weights only (not biases, LayerNorm or
        Embedding weights). A tied head's weight is the embedding's: it does not decay, as in
        minGPT (which sees the parameter once, under the embedding)."""
        decay, no_decay = set(), set()
        for mn, m in self.named_modules():
            for pn, _ in m.named_parameters(recurse=False):
                fpn = f"{mn}.{pn}" if mn else pn
                if pn.endswith("weight") and isinstance(m, nn.Linear):
                    decay.add(fpn)
                else:
                    no_decay.add(fpn)
        params = dict(self.named_parameters())  # one name per parameter (a tied head's: wte's)
        decay &= params.keys()
        no_decay = (no_decay & params.keys()) - decay
        assert decay | no_decay == params.keys()
        groups = [{"params": [params[n] for n in sorted(decay)], "weight_decay": weight_decay},
                  {"params": [params[n] for n in sorted(no_decay)], "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas)

    def forward(self, idx, targets=None):
        """idx: int64 [B, T] -> logits [B, T, vocab]; with targets also the mean cross-entropy."""
        T = idx.size(1)
        assert T <= self.block_size, f"cannot forward {T} tokens, the block size is {self.block_size}"
        pos = torch.arange(0, T, dtype=torch.long, device=idx.device).unsqueeze(0)
        tr = self.transformer
        x = tr.drop(tr.wte(idx) + tr.wpe(pos))
        for block in tr.h:
            x = block(x)
        logits = self.lm_head(tr.ln_f(x))
        if targets is None:
            return logits
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
