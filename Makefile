# The two commands a new machine needs (see README.md).
.PHONY: demo test plugins
demo:
	scripts/demo
test:
	scripts/test
plugins:
	scripts/build-plugins
