.PHONY: test lint format bench

test:
	python -m pytest -q

lint:
	ruff check .
	ruff format --check .

format:
	ruff format .
	ruff check --fix .

bench:
	python benchmarks/bench_engine.py
