"""Writes examples/classify/wine.csv: the UCI Wine data set (178 wines from three cultivars, 13
chemical measurements each) as scikit-learn ships it (sklearn.datasets.load_wine), with a header
row and the cultivar (0, 1, 2) as the last column "cultivar".

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install scikit-learn
    /tmp/venv/bin/python tools/make_wine_csv.py examples/classify/wine.csv

Source: Forina, M. et al., PARVUS (1988), via the UCI Machine Learning Repository
(https://doi.org/10.24432/C5PC7J, CC BY 4.0); bundled with scikit-learn (BSD-3-Clause).
"""
import sys

from sklearn.datasets import load_wine


def main():
    d = load_wine()
    with open(sys.argv[1], "w") as f:
        f.write(",".join(d.feature_names + ["cultivar"]) + "\n")
        for row, label in zip(d.data, d.target):
            f.write(",".join(f"{v:g}" for v in row) + f",{int(label)}\n")


if __name__ == "__main__":
    main()
