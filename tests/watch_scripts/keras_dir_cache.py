"""The Keras guides' input from files: ``keras.utils.image_dataset_from_directory`` (one folder
per class), cached after decoding and prefetched (``.cache().prefetch(AUTOTUNE)``), a small
convolutional model. Planted truth: the pipeline keeps the decoded batches in the process after
epoch 1, so later epochs read no files. Usage: keras_dir_cache.py FOLDER [EPOCHS]
"""

import os
import sys

os.environ["KERAS_BACKEND"] = "tensorflow"
import keras
import tensorflow as tf

root, epochs = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3
train_ds = keras.utils.image_dataset_from_directory(root, batch_size=16, image_size=(32, 32))
train_ds = train_ds.cache().prefetch(tf.data.AUTOTUNE)
model = keras.Sequential([keras.Input(shape=(32, 32, 3)), keras.layers.Rescaling(1 / 255),
                          keras.layers.Conv2D(8, 3, activation="relu"),
                          keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(1)])
model.compile(optimizer="adam", loss=keras.losses.BinaryCrossentropy(from_logits=True))
model.fit(train_ds, epochs=epochs, verbose=2)
