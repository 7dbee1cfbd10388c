"""The record-making library: prepare (raw documents → the input format), spm_train, and create (the plan, the
encode stage, the units, local and Beam runners). Writes what dataformat/ describes; never imports TensorFlow or
pretrain/."""
