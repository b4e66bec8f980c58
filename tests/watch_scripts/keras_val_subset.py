"""The Keras 2 tutorials' ImageDataGenerator with ``validation_split``: one generator with
random transforms, ``flow_from_directory(subset="training")`` for training and
``subset="validation"`` for validation, on tf-keras (``TF_USE_LEGACY_KERAS=1``). Planted truth:
the validation subset keeps the generator's augmentation (every validation image is warped at
random); with ``--plain-val`` validation goes through a second generator, the same split and the
rescaling alone, as it should. Usage: keras_val_subset.py DIR [--plain-val]
"""

import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf
from tensorflow.keras import layers, models
from tensorflow.keras.preprocessing.image import ImageDataGenerator

folder = sys.argv[1]
augmenting = ImageDataGenerator(rescale=1 / 255.0, rotation_range=30, zoom_range=0.2,
                                horizontal_flip=True, validation_split=0.25)
plain = ImageDataGenerator(rescale=1 / 255.0, validation_split=0.25)
flow = dict(target_size=(48, 48), batch_size=16, class_mode="binary", seed=1)
train = augmenting.flow_from_directory(folder, subset="training", **flow)
val = (plain if "--plain-val" in sys.argv else augmenting).flow_from_directory(
    folder, subset="validation", **flow)
model = models.Sequential([layers.Input((48, 48, 3)), layers.Conv2D(8, 3, activation="relu"),
                           layers.GlobalAveragePooling2D(), layers.Dense(1, activation="sigmoid")])
model.compile("adam", "binary_crossentropy", metrics=["accuracy"])
tf.random.set_seed(0)
model.fit(train, validation_data=val, epochs=2, verbose=2)
