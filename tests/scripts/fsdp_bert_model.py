"""fsdp_bert.py's model, seed and data: a tiny BERT from a ``transformers`` config (2
layers, hidden 64, no dropout) for sequence classification. tests/test_fsdp.py builds
the same in CPU torch for the reference losses."""
import torch
from transformers import BertConfig, BertForSequenceClassification

CONFIG = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=128, max_position_embeddings=32, num_labels=4,
              hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def make_model():
    """The model (seed 0), 8 sequences of 16 token ids and their labels."""
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(**CONFIG, attn_implementation="eager"))
    ids = torch.randint(0, CONFIG["vocab_size"], (8, 16))
    labels = torch.randint(0, CONFIG["num_labels"], (8,))
    return model, ids, labels
