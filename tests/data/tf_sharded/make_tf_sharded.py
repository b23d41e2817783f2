"""How tests/data/tf_sharded was made (needs TensorFlow; not run by the tests).

TensorFlow 2.21.0 (tensorflow-cpu, a throwaway venv), TF1 graph mode, two CPU devices,
``tf.compat.v1.train.Saver(sharded=True)``: a 3-shard V2 checkpoint ``tf.ckpt`` with float32
variables on two devices, a bfloat16 variable and ``global_step`` (int64), and their values
(bfloat16 cast to float32) in ``tf_values.npz`` ("/" in names as "__").
Run: python make_tf_sharded.py OUT_DIR
"""

import os
import sys

import numpy as np
import tensorflow as tf

out = sys.argv[1]
rng = np.random.RandomState(0)
for i in range(30):  # the generator state the committed files were made with
    rng.randn(3, i + 1)
rng.randn(5)
tf.compat.v1.disable_eager_execution()
with tf.Graph().as_default():
    with tf.device("/cpu:0"):
        a = tf.compat.v1.get_variable("bert/a", initializer=rng.randn(4, 6).astype(np.float32))
    with tf.device("/cpu:1"):
        b = tf.compat.v1.get_variable("bert/b", initializer=rng.randn(7).astype(np.float32))
    c = tf.compat.v1.get_variable(
        "bert/c", initializer=tf.constant(rng.randn(2, 3).astype(np.float32), dtype=tf.bfloat16)
    )
    step = tf.compat.v1.train.get_or_create_global_step()
    saver = tf.compat.v1.train.Saver(sharded=True)
    config = tf.compat.v1.ConfigProto(device_count={"CPU": 2})
    with tf.compat.v1.Session(config=config) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        saver.save(sess, os.path.join(out, "tf.ckpt"), write_meta_graph=False)
        values = sess.run([a, b, tf.cast(c, tf.float32), step])
names = ["bert__a", "bert__b", "bert__c", "global_step"]
np.savez(os.path.join(out, "tf_values.npz"), **dict(zip(names, values)))
