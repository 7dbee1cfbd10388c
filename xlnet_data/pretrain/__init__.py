"""The pretraining library (TensorFlow): the run's configs (config.py, no TensorFlow), the TF2 XLNet (modeling.py,
model_ops.py), its input pipeline from records or a token cache (inputs.py, cache_input.py), the training loop
(training.py with trainer, distribution, sources, resume, reporting), checkpoints and Hugging Face conversion.
Reads what dataformat/ describes; never imports datagen/."""
