"""A Keras 3 script stepscope did not write: model.fit with validation_data, 2 epochs."""

import os

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras
import numpy as np

rng = np.random.default_rng(0)
x_train = rng.normal(size=(64, 16)).astype("float32")
y_train = rng.integers(0, 2, size=(64,))
x_val = rng.normal(size=(24, 16)).astype("float32")
y_val = rng.integers(0, 2, size=(24,))

model = keras.Sequential([
    keras.Input(shape=(16,)),
    keras.layers.Dense(32, activation="relu"),
    keras.layers.Dense(2, activation="softmax"),
])
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
model.fit(x_train, y_train, batch_size=16, epochs=2, validation_data=(x_val, y_val), verbose=2)
