"""XLNet pretraining in PyTorch, with no TensorFlow on its import path: the model (modeling.py, whose parameter names
are Hugging Face's XLNetLMHeadModel's), a reader of TensorFlow checkpoints (tf_checkpoint.py), the examples and the
trainer."""
