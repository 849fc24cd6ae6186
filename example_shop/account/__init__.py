"""The account service: a Django project where paying an order sends ``order.paid``."""
