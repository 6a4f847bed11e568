"""The fused training kernels a model may declare (``fused_kernel()``), by name.

A model's class declares the kernel whose written-out step computes its SGD
step (not inherited: a subclass may change its forward). The client runs that
kernel only for a model that declares it and has exactly the parameters it
assumes, and autograd for every other model. The engines and the client read
the declaration, never the model's class.
"""

# McMahan's CNN (client/cnn_step.py): conv5x5(32)-pool-relu, conv5x5(64)-pool-relu,
# fc 3136->512-relu, fc 512->C, computed channels_last.
CNN_KERNEL = "mcmahan_cnn"
