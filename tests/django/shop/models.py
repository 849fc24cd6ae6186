from django.db import models


class Account(models.Model):
    name = models.CharField(max_length=32, unique=True)
    balance = models.IntegerField()


class Points(models.Model):
    account = models.CharField(max_length=32)
    points = models.IntegerField()
