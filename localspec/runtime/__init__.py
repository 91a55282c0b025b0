"""The engine's parts at run time: the target and the drafter over llama.cpp, their graph
taps, the session state kept between calls, and the clock that prices their work."""
