"""Transactional messages for Python web apps, RocketMQ style."""
