.PHONY: test lint format bench

test:
	python -m pytest -q

lint:
	ruff check .
	ruff format --check .
	mypy localspec converters tui

format:
	ruff format .
	ruff check --fix .

bench:
	python benchmarks/bench_engine.py
