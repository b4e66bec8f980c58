"""The seed's own Keras script (``/work/shared/seed/question.txt``), as its author wrote it, on
Keras 3 with the TensorFlow backend.

    python keras_seed.py DATA OUT [--epochs E]

ImageDataGenerator with the seed's augmentation and ``preprocess_input``, flow_from_dataframe
at 299 px in batches of 8, a frozen InceptionResNetV2 (``weights=None``: there is no network
here, and speed does not depend on the values) with average pooling and Dense(1, sigmoid),
Adam 1e-4, ModelCheckpoint on the best ``val_accuracy``, validation every epoch. Changes, all
for Keras 3 or for time: ``fit`` for ``fit_generator``, ``learning_rate=`` for ``lr=``, no
``period=``, and few images (the test's dataset) so a 2-core CPU gets through
InceptionResNetV2 at 299 px in minutes.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import pandas as pd
import tensorflow as tf
from keras.applications.inception_resnet_v2 import (
    InceptionResNetV2,
    preprocess_input,
)
from keras.callbacks import ModelCheckpoint
from keras.layers import Dense
from keras.models import Model
from keras.src.legacy.preprocessing.image import ImageDataGenerator

p = argparse.ArgumentParser()
p.add_argument("data", type=Path)
p.add_argument("out", type=Path)
p.add_argument("--epochs", type=int, default=2)
args = p.parse_args()

train_data = pd.read_csv(args.data / "train.csv")
valid_data = pd.read_csv(args.data / "valid.csv")

train_datagen = ImageDataGenerator(rotation_range=30,
                                   width_shift_range=0.4,
                                   height_shift_range=0.4,
                                   shear_range=0.4,
                                   zoom_range=0.25,
                                   horizontal_flip=True,
                                   brightness_range=[0.5, 1.5],
                                   preprocessing_function=preprocess_input)

valid_datagen = ImageDataGenerator(preprocessing_function=preprocess_input)

train_generator = train_datagen.flow_from_dataframe(train_data,
                                                    directory=str(args.data / "images"),
                                                    x_col="Photo",
                                                    y_col="Class",
                                                    target_size=(299, 299),
                                                    class_mode="binary",
                                                    seed=42,
                                                    batch_size=8)

validation_generator = valid_datagen.flow_from_dataframe(valid_data,
                                                         directory=str(args.data / "images"),
                                                         x_col="Photo",
                                                         y_col="Class",
                                                         target_size=(299, 299),
                                                         class_mode="binary",
                                                         seed=42,
                                                         batch_size=8)

inception_resnet_v2 = InceptionResNetV2(include_top=False,
                                        weights=None,
                                        input_shape=(299, 299, 3),
                                        pooling="avg",
                                        classes=2)
inception_resnet_v2.trainable = False

out = Dense(1, activation="sigmoid")(inception_resnet_v2.output)

model = Model(inputs=inception_resnet_v2.inputs, outputs=out)

checkpoint = ModelCheckpoint(str(args.out / "model.h5"),
                             monitor="val_accuracy",
                             verbose=0,
                             save_best_only=True,
                             save_weights_only=False,
                             mode="max")

optim = tf.keras.optimizers.Adam(learning_rate=0.0001)
model.compile(optimizer=optim, loss="binary_crossentropy", metrics=["accuracy"])

hist = model.fit(train_generator,
                 steps_per_epoch=len(train_generator),
                 epochs=args.epochs,
                 callbacks=[checkpoint],
                 validation_data=validation_generator,
                 verbose=2)
