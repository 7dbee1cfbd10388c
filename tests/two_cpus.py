"""`two_cpus MODULE FUNCTION ARGS...`, a command for conftest.run_modules_forked: MODULE.FUNCTION(*ARGS) (a module of
tests/) in a process whose CPU is two logical devices, for the checks of two replicas (MirroredStrategy) that the
test process, its one CPU device made, cannot run. Prints "check OK" once the function returned and leaves with
os._exit, keeping what it returned: freeing a run's input iterators waited seconds with the CPU idle."""

import importlib
import os
import sys


def run():
    import tensorflow as tf  # imported, not started, by the fork server: the devices are set before the first op
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    module, function, *args = sys.argv[1:]
    _kept = getattr(importlib.import_module(module), function)(*args)
    print("check OK", flush=True)
    os._exit(0)
